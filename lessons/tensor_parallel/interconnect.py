"""Lesson 10, section 6: tensor parallelism at the scale of a real run — why it stays inside a node, on paper.

The whole-cluster planner that ranks layouts is lesson 16's (lessons/plan_a_run)."""

import dataclasses

from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.layout import Layout
from labtools.plan import step_time
from labtools.quiz import Question, answer_check
from labtools.shapes import MODELS
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
    ledger.add("tp_nvlink", "\"TP requires fast interconnect\": over NVLink, GPT-3's tp = 8 all-reduces cost under "
               "10% of the compute time (computed, TP comm ÷ compute)", ratio["nvlink"], at_most(0.10),
               source="a widely repeated statement", kind="computed")
    ledger.add("tp_network", "\"TP requires fast interconnect\": across nodes (HDR, 25 GB/s per GPU) the same tp = 8 "
               "all-reduces cost at least half of the compute time (computed)", ratio["network"], at_least(0.5),
               source="a widely repeated statement", kind="computed")
    return Findings([
        f"Because its all-reduces sit on every layer's critical path: for GPT-3 over NVLink they cost "
        f"**{ratio['nvlink']:.0%}** of the compute time; across nodes they would cost **{ratio['network']:.0%}** "
        "(computed).",
        "Lesson 16 weighs this against the pipeline's bubble and the other collectives for every layout of a "
        "cluster.",
    ])


def exercises(ledger: Ledger) -> list[Question]:
    per_layer = 8 * (8 - 1) / 8 * 4 * 2048 * 12288 * 2 / GB  # 8(tp−1)/tp · b·s·h elements, bf16
    ledger.note("exercise_bytes_per_layer_gb", per_layer)
    return [
        Question("Bytes per layer", "GPT-3 with the shape in the table above: how many GB does each GPU send per layer "
                 "for one forward and backward, under ring all-reduces, in bf16?", {"gb": "GB per layer"},
                 answer_check({"gb": per_layer}),
                 "$8 \\cdot \\frac{7}{8} \\cdot 4 \\cdot 2048 \\cdot 12288 \\cdot 2$ bytes = "
                 f"**{per_layer:.2f} GB** per layer and micro-batch; over $L = 96$ layers, {96 * per_layer:.0f} GB "
                 "per micro-batch, which only NVLink carries fast enough."),
    ]
