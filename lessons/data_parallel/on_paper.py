"""Lesson 07, on paper: what a 70B model's gradient all-reduce costs, by the ring's formula (labtools.plan)."""

from labtools import plan
from labtools.widgets import Exercise, answer_check

GB = 1e9


def allreduce_answers(n: int = 256, params: float = 70e9, link_gbps: float = 100, alpha: float = 10e-6) -> dict:
    M = 2 * params               # bf16 gradients, bytes
    beta = link_gbps * 1e9 / 8   # bytes per second
    return {"volume_gb": plan.collective_bytes("all_reduce", M, n) / GB,
            "seconds": plan.collective_time("all_reduce", M, n, bandwidth=beta, latency=alpha)}


def allreduce_exercise() -> Exercise:
    ar = allreduce_answers()
    return Exercise(
        "A 70B all-reduce", "Data parallelism over N = 256 GPUs, bf16 gradients (2 bytes each), a ring all-reduce over "
        "a 100 Gb/s link per GPU with α = 10 µs per step. How many GB does each GPU send, and how many seconds does "
        "the all-reduce take (time = 2(N−1)·α + bytes sent ÷ bandwidth)?",
        {"volume_gb": "GB sent per GPU", "seconds": "seconds"}, answer_check(ar),
        "M = 70e9 × 2 B = 140 GB. The ring sends 2(N−1)/N · M = 2 · 255/256 · 140 = "
        f"**{ar['volume_gb']:.1f} GB** per GPU. At 100 Gb/s = 12.5 GB/s that is {ar['volume_gb'] / 12.5:.2f} s, plus "
        f"2 · 255 · 10 µs = 5.1 ms of latency: **{ar['seconds']:.2f} s**, every step, unless it overlaps backward or "
        "the states are sharded (lesson 08).")
