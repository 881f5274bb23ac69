"""Lesson 06, section 2b: statements from outside the lab about memory, settled by the estimate."""

import plotly.graph_objects as go

from labtools import plots
from labtools.budget import estimate
from labtools.claims import Findings, Ledger, approx, at_least, at_most
from lessons.memory_budget import GB


def run() -> dict:
    """Computed budgets behind four widely repeated statements (every number from estimate())."""
    mixed, fp32 = estimate(7_000_000_000), estimate(7_000_000_000, precision="fp32", optimizer="adam")
    zero1 = {n: estimate(70_000_000_000, zero_stage=1, dp=n).model_states for n in (8, 32, 64, 1024, 4096)}
    offload = {}
    for label, z in (("DDP", 0), ("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3)):
        on_gpu = estimate(7_000_000_000, zero_stage=z, dp=8).total
        offload[label] = {"none": on_gpu,
                          "optimizer": estimate(7_000_000_000, zero_stage=z, dp=8, offload="optimizer").total}
    return {"mixed": mixed, "fp32": fp32, "zero1_70b": zero1, "offload_7b_8gpu": offload}


def figure(c: dict) -> go.Figure:
    rows = [(k, f"{v['none'] / GB:.2f}", f"{v['optimizer'] / GB:.2f}", f"{v['none'] / v['optimizer']:.2f}×")
            for k, v in c["offload_7b_8gpu"].items()]
    return plots.table(("7B on 8 GPUs", "per GPU (GB)", "optimizer + master offloaded (GB)", "GPU memory saved"),
                       rows, title="CPU offload of the optimizer: how much GPU memory it saves depends on the sharding")


def findings(ledger: Ledger, c: dict) -> Findings:
    mixed, fp32 = c["mixed"], c["fp32"]
    without_master = mixed.bytes_per_param() * (1 - mixed.parts["master weights"] / mixed.model_states)
    ledger.add("articles_12_bytes", "'bf16 weights + fp32 optimizer = 12 bytes/param, 0.75× of fp32' leaves out the "
               "fp32 master copy: with it, mixed-precision AdamW keeps 16 bytes/param, 1.0× fp32 + Adam's (ratio)",
               mixed.model_states / fp32.model_states, approx(1.0, rel=1e-9),
               source="a widely repeated statement (12, 0.75×)", kind="computed")
    ledger.note("bytes_per_param_without_master", without_master)
    fp32_states = (mixed.parts["master weights"] + mixed.parts["optimizer state"]) / GB
    ledger.add("articles_7b_84", "Another widely repeated 7B breakdown 14 + 14 + 84 + 16 GB is consistent: its 84 "
               "GB is the master copy and Adam's two moments = 12 bytes/param of fp32 state (GB)", fp32_states,
               approx(84.0, rel=1e-9),
               source="a widely repeated statement", kind="computed", detail=True)
    z1 = c["zero1_70b"]
    ledger.add("articles_70b_zero1", "'70B would need 32+ GPUs with ZeRO-1' — no number of GPUs fits: ZeRO-1 keeps "
               "the whole bf16 weights and gradients on every GPU, ≥ 280 GB (per-GPU model states at N = 4096, GB)",
               z1[4096] / GB, at_least(280.0), source="a widely repeated statement", kind="computed")
    off = c["offload_7b_8gpu"]
    saved = {k: v["none"] / v["optimizer"] for k, v in off.items()}
    ledger.add("articles_offload_ddp", "'CPU offloading: 4–8× less GPU memory' holds unsharded: offloading AdamW's "
               "state and master copy takes DDP from 16 to 4 bytes/param (ratio)", saved["DDP"], approx(4.0, rel=1e-9),
               source="a widely repeated statement (4–8×, 20–50% overhead)", kind="computed", detail=True)
    ledger.add("articles_offload_zero2", "'CPU offloading: 4–8× less GPU memory' holds only unsharded: once ZeRO has "
               "sharded the optimizer state, offloading it saves under 2× (ZeRO-2 on 8 GPUs, ratio)", saved["ZeRO-2"],
               at_most(2.0), kind="computed")
    ledger.note("offload_saved", saved)
    sharded = max(saved["ZeRO-1"], saved["ZeRO-2"])
    z1_table = "| GPUs | 70B's model states per GPU under ZeRO-1 (GB) |\n|---|---|\n" + "\n".join(
        f"| {n:,} | {v / GB:,.0f} |" for n, v in z1.items())
    same = mixed.model_states == fp32.model_states
    return Findings([
        "\"12 bytes per parameter, 0.75×\" forgets the fp32 master copy: with it, mixed-precision AdamW keeps "
        + ("as much as fp32 Adam." if same else f"{mixed.model_states / fp32.model_states:.2f}× fp32 Adam's."),
        f"That breakdown agrees: its first three terms are the same {mixed.model_states / GB:.0f} GB of model "
        "states, the largest, "
        f"**{fp32_states:.0f} GB**, being the master copy and Adam's two moments; its fourth lies outside them.",
        f"No number of GPUs fits 70B under ZeRO-1: it keeps the whole bf16 weights and gradients, "
        f"**{z1[max(z1)] / GB:.0f} GB**, on every GPU.",
        f"Offloading cuts GPU memory **{saved['DDP']:.0f}×** without sharding, but under ZeRO-1 and ZeRO-2 the state "
        f"it moves is already sharded: on eight GPUs it saves **{sharded:.1f}×** at most.",
    ], [
        f"Bytes per parameter: {without_master:.0f} without the master copy, {mixed.bytes_per_param():.0f} with it "
        "(computed).",
        z1_table,
    ])
