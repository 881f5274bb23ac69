"""Lesson 07, on paper: what a 70B model's gradient all-reduce costs, by the ring's formula (labtools.plan)."""

from labtools import plan
from labtools.quiz import Question, answer_check

GB = 1e9


def allreduce_answers(n: int = 256, params: float = 70e9, link_gbps: float = 100, alpha: float = 10e-6) -> dict:
    M = 2 * params               # bf16 gradients, bytes
    beta = link_gbps * 1e9 / 8   # bytes per second
    return {"volume_gb": plan.collective_bytes("all_reduce", M, n) / GB,
            "seconds": plan.collective_time("all_reduce", M, n, bandwidth=beta, latency=alpha)}


def allreduce_exercise() -> Question:
    """The givens (N = 256, 70B parameters, bf16 gradients, a 100 Gb/s link, α = 10 µs) are in the notebook's table."""
    ar = allreduce_answers()
    return Question(
        "A 70B all-reduce", "With the givens in the table above: how many GB does each GPU send, and how many seconds "
        "does the all-reduce take?",
        {"volume_gb": "GB sent per GPU", "seconds": "seconds"}, answer_check(ar),
        "- Gradients: $M = 70\\text{B} \\times 2$ bytes $= 140$ GB.\n\n"
        "- Sent per GPU: $2\\frac{N-1}{N}M = 2 \\cdot \\frac{255}{256} \\cdot 140$ GB = "
        f"**{ar['volume_gb']:.1f} GB**.\n\n"
        f"- Time: $2 \\cdot 255 \\cdot 10\\,\\mu s + {ar['volume_gb']:.1f}\\text{{ GB}} / 12.5\\text{{ GB/s}}$ "
        f"(a 100 Gb/s link) = **{ar['seconds']:.2f} s**, every step, unless it overlaps backward or the states are "
        "sharded (lesson 08).")
