"""Lesson 06, section 4: exercises, checked."""

from labtools import plan
from labtools.budget import estimate
from labtools.claims import Ledger, is_true
from labtools.plan import MODELS, Layout
from labtools.widgets import Exercise, answer_check
from lessons.memory_budget import GB, budget


def ex_zero_answers() -> dict:
    return {f"z{z}": estimate(7_000_000_000, zero_stage=z, dp=4).total / GB for z in range(4)}


def ex_allreduce_answers(n: int = 256, params: float = 70e9, link_gbps: float = 100, alpha: float = 10e-6) -> dict:
    M = 2 * params               # bf16 gradients, bytes
    beta = link_gbps * 1e9 / 8   # bytes per second
    return {"volume_gb": plan.collective_bytes("all_reduce", M, n) / GB,
            "seconds": plan.collective_time("all_reduce", M, n, bandwidth=beta, latency=alpha)}


def ex_pipeline_answers(P: int = 32) -> dict:
    return {f"m{M}": plan.pipeline_efficiency(P, M) for M in (8, 16, 32, 64)}


def ex_layout_check(answers: dict) -> tuple[bool, str]:
    tp, pp, dp, z = (int(answers.get(k, 0)) for k in ("tp", "pp", "dp", "zero"))
    if z not in (0, 1, 2, 3):
        return False, "ZeRO stage must be 0–3"
    model = MODELS["405B"]
    try:
        plan.check_layout(model, Layout(dp, tp, pp), world=2048, gpus_per_node=8)
    except ValueError as e:
        return False, str(e)
    note = (f" ({model.n_layer} layers do not split evenly into {pp} stages; the largest stage has "
            f"{-(-model.n_layer // pp)})") if model.n_layer % pp else ""
    b = budget("405B", zero_stage=z, dp=dp, tp=tp, pp=pp, micro_batch=1, seq=8192, checkpoint="block")
    fits = b.total <= 80 * GB
    return fits, (f"{b.total / GB:.1f} GB per GPU (model states {b.model_states / GB:.1f} GB, activations "
                  f"{b.parts.get('activations', 0) / GB:.1f} GB){note} — {'fits' if fits else 'does not fit'} 80 GB")


LAYOUT_SOLUTION = {"tp": 8, "pp": 16, "dp": 16, "zero": 1}


def exercises(ledger: Ledger) -> list[Exercise]:
    """The exercises; the ledger records that the layout of the last one's solution fits."""
    z = ex_zero_answers()
    ar = ex_allreduce_answers()
    pp = ex_pipeline_answers()
    fits, verdict = ex_layout_check(LAYOUT_SOLUTION)
    ledger.add("layout", "The 405B layout of the exercise's solution fits 80 GB (computed)", fits, is_true(),
               kind="computed")
    ledger.note("layout_solution", verdict)

    return [
        Exercise("ZeRO for 7B on 4 GPUs", "bf16 mixed precision with AdamW (16 bytes/param unsharded). What does one "
                 "GPU hold, in GB, for model states under ZeRO stages 0, 1, 2 and 3 with dp = 4?",
                 {f"z{s}": f"stage {s}" for s in range(4)}, answer_check(z),
                 "Stage 0: 2 + 2 + 12 = 16 B/param → **112 GB**. Stage 1 shards the 12 bytes of fp32 master + Adam "
                 f"state: 2 + 2 + 12/4 = 7 → **{z['z1']:.1f} GB**. Stage 2 also the gradients: 2 + 14/4 = 5.5 → "
                 f"**{z['z2']:.1f} GB**. Stage 3 everything: 16/4 = 4 → **{z['z3']:.1f} GB**."),
        Exercise("A 70B all-reduce", "Data parallelism over 256 GPUs, bf16 gradients, a ring all-reduce over a "
                 "100 Gb/s link per GPU with α = 10 µs per step. How many GB does each GPU send, and how many seconds "
                 "does the all-reduce take (time = 2(N−1)·α + volume / bandwidth)?",
                 {"volume_gb": "GB sent per GPU", "seconds": "seconds"}, answer_check(ar),
                 "M = 70e9 × 2 B = 140 GB. Ring all-reduce sends 2(N−1)/N · M = 2 · 255/256 · 140 = "
                 f"**{ar['volume_gb']:.1f} GB** per GPU. At 100 Gb/s = 12.5 GB/s that is {ar['volume_gb'] / 12.5:.2f} "
                 f"s, plus 2 · 255 · 10 µs = 5.1 ms of latency: **{ar['seconds']:.2f} s** — every step, unless "
                 "overlapped with backward or sharded (lesson 08)."),
        Exercise("Pipeline efficiency", "A pipeline of P = 32 stages runs M micro-batches per step (GPipe or 1F1B). "
                 "What fraction of the time is useful work, 1 − (P−1)/(M+P−1), for M = 8, 16, 32 and 64?",
                 {f"m{M}": f"M = {M}" for M in (8, 16, 32, 64)}, answer_check(pp),
                 "Bubble = (P−1)/(M+P−1): " + ", ".join(f"M = {M}: efficiency **{pp[f'm{M}']:.1%}**"
                                                         for M in (8, 16, 32, 64))
                 + ". Deep pipelines need many micro-batches, hence large global batches."),
        Exercise("405B on 2048 GPUs", "Choose tensor, pipeline and data parallel degrees (tp × pp × dp = 2048, tp ≤ 8) "
                 "and a ZeRO stage so that bf16 mixed-precision AdamW training of a 405B model fits 80 GB GPUs "
                 "(sequence 8192, micro-batch 1, every block checkpointed). The calculator judges your layout.",
                 {"tp": "tp", "pp": "pp", "dp": "dp", "zero": "ZeRO stage"}, ex_layout_check,
                 "One layout that fits: **tp = 8** (inside a node), **pp = 16**, **dp = 16**, **ZeRO-1**: "
                 + verdict
                 + ". Meta trained Llama 3.1 405B with tp 8 and pp 16 (and context parallelism for long sequences).")]
