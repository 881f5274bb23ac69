"""Lesson 12, section 2: this machine's matmul peak, and a step's model and hardware FLOP utilisation."""

import statistics
import time

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, between
from labtools.device import pick_device
from labtools.progress import progress
from lessons.compute_budget import Settings, corpus, gpt
from lessons.compute_budget.flops import counted_flops


def matmul_peak(S: Settings) -> dict[str, dict]:
    """Achieved FLOP/s of n×n matrix products, fp32 and bf16, best over sizes and repeats: the 'peak' MFU is
    measured against here (a vendor's peak on a GPU; a CPU has no honest published one)."""
    return profiling.matmul_peak(S.matmul_sizes, pick_device(), (("fp32", torch.float32), ("bf16", torch.bfloat16)))


def run(S: Settings, peak: dict) -> dict:
    """Tokens/s of real fp32 training steps (forward, backward, AdamW) of the timed model, without and with
    per-block activation checkpointing, in alternating rounds; MFU counts the model's FLOPs, HFU the hardware's
    (recomputation included, counted by FlopCounterMode)."""
    models = {"plain": gpt(S.n_layer, S.n_embd, S.n_head, S.block_size, S.seed),
              "checkpointed": gpt(S.n_layer, S.n_embd, S.n_head, S.block_size, S.seed, checkpoint="block")}
    counts = {k: counted_flops(m, S.block_size, S.batch_size, S.seed)["train"] for k, m in models.items()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    g = torch.Generator().manual_seed(S.seed)
    X, Y = corpus().batch("train", S.batch_size, S.block_size, g, pick_device())
    sync = torch.cuda.synchronize if X.is_cuda else (lambda: None)

    def steps(k, n):
        for _ in range(n):
            models[k](X, Y)[1].backward()
            opts[k].step()
            opts[k].zero_grad(set_to_none=True)
    for k in models:
        steps(k, 1)  # warm-up
    rate = {k: [] for k in models}
    for _ in progress(range(S.time_rounds), desc="timing rounds"):
        for k in models:
            sync()
            t0 = time.perf_counter()
            steps(k, S.time_steps)
            sync()
            rate[k].append(S.time_steps * S.batch_size * S.block_size / (time.perf_counter() - t0))
    tps = {k: statistics.median(v) for k, v in rate.items()}
    p = peak["fp32"]["peak"]
    return {"tokens_per_s": tps, "rounds": rate, "model_flops": counts["plain"], "hardware_flops": counts,
            "mfu": tps["plain"] * counts["plain"] / p, "mfu_checkpointed": tps["checkpointed"] * counts["plain"] / p,
            "hfu_checkpointed": tps["checkpointed"] * counts["checkpointed"] / p, "peak": p}


def figure(peak: dict, u: dict) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Matrix products: achieved GFLOP/s",
                                                        "A training step: share of the fp32 peak"))
    for i, (name, r) in enumerate(peak.items()):
        fig.add_trace(go.Scatter(x=list(r["by_size"]), y=[v / 1e9 for v in r["by_size"].values()], name=name,
                                 mode="lines+markers", line=dict(color=plots.color(i))), row=1, col=1)
    bars = {"MFU (plain)": u["mfu"], "MFU (checkpointed)": u["mfu_checkpointed"],
            "HFU (checkpointed)": u["hfu_checkpointed"]}
    fig.add_trace(go.Bar(x=list(bars), y=[100 * v for v in bars.values()], showlegend=False,
                         marker_color=[plots.color(2), plots.color(3), plots.color(4)],
                         text=[f"{100 * v:.1f}%" for v in bars.values()], textposition="outside"), row=1, col=2)
    fig.update_xaxes(title_text="n (n×n @ n×n)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="GFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="% of the measured fp32 peak", row=1, col=2)
    plots.style(fig, height=380)
    return fig


def bf16_words(dev: torch.device, peak: dict) -> str:
    ratio = peak["bf16"]["peak"] / peak["fp32"]["peak"]
    if dev.type == "cuda":
        return f"bf16 {ratio:.1f}× fp32: the tensor cores"
    if ratio < 0.8:
        return (f"bf16 at {ratio:.2f}× fp32: this CPU has no bf16 matrix units, so bf16 products are converted and "
                "run slower")
    return f"bf16 at {ratio:.1f}× fp32: this CPU has bf16 matrix instructions"


def findings(ledger: Ledger, peak: dict, u: dict) -> Findings:
    recompute = u["hardware_flops"]["checkpointed"] / u["model_flops"]
    ledger.add("hfu_recompute", "With per-block checkpointing the hardware does more than the model needs, but less "
               "than one extra forward (hardware ÷ model FLOPs; 8P/6P = 4/3 would be a whole forward)",
               recompute, between(1.01, 4 / 3), kind="counted")
    ledger.note("matmul_flops_per_s", {k: v["by_size"] for k, v in peak.items()})
    ledger.note("tokens_per_s", u["rounds"])
    ledger.note("mfu_hfu", {"mfu": u["mfu"], "mfu_checkpointed": u["mfu_checkpointed"],
                            "hfu_checkpointed": u["hfu_checkpointed"]})
    dev = pick_device()
    return Findings([
        f"Far from all of it: a training step of this small model ran at **MFU {u['mfu']:.0%}** of the best rate "
        "matrix products reach here. Recomputing activations raises the hardware's share, not the model's.",
    ], [
        f"Matrix products on this {dev.type.upper()}: {peak['fp32']['peak'] / 1e9:.1f} GFLOP/s in fp32, "
        f"{peak['bf16']['peak'] / 1e9:.1f} in bf16 ({bf16_words(dev, peak)}).",
        f"A step of the {u['model_flops']:,.0f}-FLOP-per-token model: {u['tokens_per_s']['plain']:,.0f} tokens/s.",
        f"With checkpointing the hardware did {recompute:.2f}× the model's FLOPs: HFU {u['hfu_checkpointed']:.1%}, "
        f"MFU {u['mfu_checkpointed']:.1%}.",
    ])
