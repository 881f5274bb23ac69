"""Lesson 10, section 6: tensor parallelism at the scale of a real run — why it stays inside a node, on paper.

The whole-cluster planner that ranks layouts is lesson 16's (lessons/plan_a_run)."""

import dataclasses

from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.plan import MODELS, Layout, step_time
from labtools.widgets import Exercise, answer_check
from lessons.tensor_parallel import A100, GB


def nvlink_vs_network() -> dict:
    """GPT-3 175B as TP 8 × PP 16 × DP 8 on 1024 A100s (batch 1536): the tensor-parallel all-reduces' time ÷ the
    compute time, over NVLink (300 GB/s per direction) and if the same TP 8 ran over the network (HDR, 25 GB/s)."""
    gpt3, layout = MODELS["GPT-3 175B"], Layout(8, 8, 16)
    out = {}
    for name, cluster in (("nvlink", A100), ("network", dataclasses.replace(A100, intra_bw=A100.inter_bw))):
        e = step_time(gpt3, cluster, layout, 1536)
        out[name] = e.tp_comm_s / e.compute_s
    return out


def findings(ledger: Ledger, ratio: dict) -> Findings:
    ledger.add("tp_nvlink", "\"TP requires fast interconnect\": over NVLink, GPT-3's TP 8 all-reduces cost under "
               "10% of the compute time (computed, TP comm ÷ compute)", ratio["nvlink"], at_most(0.10),
               source="a widely repeated statement", kind="computed")
    ledger.add("tp_network", "… across nodes (HDR, 25 GB/s per GPU) at least half of it (computed)", ratio["network"],
               at_least(0.5), kind="computed")
    return Findings([
        f"Over NVLink, GPT-3's tensor-parallel all-reduces cost **{ratio['nvlink']:.1%}** of the compute time; the "
        f"same TP 8 across nodes would cost **{ratio['network']:.0%}** (computed). Tensor parallelism stays inside a "
        "node.",
        "Lesson 16 weighs this against the pipeline's bubble and the other collectives for every layout of a "
        "cluster.",
    ])


def exercises(ledger: Ledger) -> list[Exercise]:
    per_layer = 8 * (8 - 1) / 8 * 4 * 2048 * 12288 * 2 / GB  # 8(t−1)/t · b·s·h elements, bf16
    ledger.note("exercise_bytes_per_layer_gb", per_layer)
    return [
        Exercise("Bytes per layer", "GPT-3: h = 12288, sequence 2048, micro-batch 4, bf16 activations (2 bytes). With "
                 "tp = 8 under ring all-reduces, how many GB does each GPU send per layer for one forward and "
                 "backward: 8·(t−1)/t·b·s·h elements?", {"gb": "GB per layer"}, answer_check({"gb": per_layer}),
                 f"8 × 7/8 × 4·2048·12288 × 2 bytes = **{per_layer:.2f} GB** per layer and micro-batch; 96 layers "
                 f"make that {96 * per_layer:.0f} GB per micro-batch, which only NVLink carries fast enough."),
    ]
