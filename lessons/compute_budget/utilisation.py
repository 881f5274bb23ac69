"""Lesson 12, section 2: this machine's matmul peak, and a step's model and hardware FLOP utilisation."""

import statistics
import time
from contextlib import contextmanager

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, at_least, between
from labtools.device import pick_device
from labtools.progress import progress
from lessons.compute_budget import Settings, corpus, gpt
from lessons.compute_budget.flops import counted_flops


@contextmanager
def one_thread():
    """On a CPU, time on one thread, the peak and the steps alike: with two, a busy machine that deschedules one of
    them stalls the other at every parallel region, and a small model's many small ops then measure the scheduler
    (a step timed 50× slower beside other work, checkpointed and plain in random order)."""
    before = torch.get_num_threads()
    if pick_device().type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def matmul_peak(S: Settings) -> dict[str, dict]:
    """Achieved FLOP/s of n×n matrix products, fp32 and bf16, best over sizes and repeats: the 'peak' MFU is
    measured against here (a vendor's peak on a GPU; a CPU has no honest published one). One thread on a CPU."""
    with one_thread():
        return profiling.matmul_peak(S.matmul_sizes, pick_device(),
                                     (("fp32", torch.float32), ("bf16", torch.bfloat16)))


def run(S: Settings, peak: dict) -> dict:
    """Tokens/s of real fp32 training steps (forward, backward, AdamW) of the timed model, without and with
    per-block activation checkpointing; MFU counts the model's FLOPs, HFU the hardware's (recomputation included,
    counted by FlopCounterMode). Without recomputation the two are one number.

    On a CPU, on one thread, as the peak is (one_thread). The two models alternate step by step, in pairs whose order alternates too, so that a busy machine slows both
    alike: the plain rate is its median step, the checkpointed one that ÷ the median of the pairs' time ratios."""
    models = {"plain": gpt(S.n_layer, S.n_embd, S.n_head, S.block_size, S.seed),
              "checkpointed": gpt(S.n_layer, S.n_embd, S.n_head, S.block_size, S.seed, checkpoint="block")}
    counts = {k: counted_flops(m, S.block_size, S.batch_size, S.seed)["train"] for k, m in models.items()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    g = torch.Generator().manual_seed(S.seed)
    X, Y = corpus().batch("train", S.batch_size, S.block_size, g, pick_device())
    sync = torch.cuda.synchronize if X.is_cuda else (lambda: None)

    def step(k) -> float:
        sync()
        t0 = time.perf_counter()
        models[k](X, Y)[1].backward()
        opts[k].step()
        opts[k].zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0
    seconds = {k: [] for k in models}
    ratios = []
    with one_thread():
        for k in models:
            step(k)  # warm-up
        for r in progress(range(S.time_rounds), desc="timing rounds"):
            for i in range(S.time_steps):
                order = list(models) if (r * S.time_steps + i) % 2 == 0 else list(models)[::-1]
                t = {k: step(k) for k in order}
                for k in models:
                    seconds[k].append(t[k])
                ratios.append(t["checkpointed"] / t["plain"])
    tokens = S.batch_size * S.block_size
    ratio = statistics.median(ratios)
    plain = tokens / statistics.median(seconds["plain"])
    tps = {"plain": plain, "checkpointed": plain / ratio}
    p = peak["fp32"]["peak"]
    return {"tokens_per_s": tps, "step_seconds": seconds, "model_flops": counts["plain"], "hardware_flops": counts,
            "step_ratio": ratio,
            "mfu": tps["plain"] * counts["plain"] / p, "mfu_checkpointed": tps["checkpointed"] * counts["plain"] / p,
            "hfu_checkpointed": tps["checkpointed"] * counts["checkpointed"] / p, "peak": p}


def figure(peak: dict, u: dict) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Matrix products: achieved GFLOP/s",
                                                        "A training step: share of the fp32 peak"))
    for i, (name, r) in enumerate(peak.items()):
        fig.add_trace(go.Scatter(x=list(r["by_size"]), y=[v / 1e9 for v in r["by_size"].values()], name=name,
                                 mode="lines+markers", line=dict(color=plots.color(i))), row=1, col=1)
    bars = {"plain: MFU = HFU": u["mfu"], "checkpointed: MFU": u["mfu_checkpointed"],
            "checkpointed: HFU": u["hfu_checkpointed"]}
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
        return f"bf16 ran {ratio:.1f}× as fast: the tensor cores"
    if ratio < 0.8:
        return f"bf16 ran {1 / ratio:.0f}× slower: this CPU has no bf16 matrix units, so bf16 products are converted"
    return f"bf16 ran {ratio:.1f}× as fast: this CPU has bf16 matrix instructions"


def recompute_rate(u: dict) -> float | None:
    """FLOP/s of the work checkpointing added: the recomputed FLOPs per token ÷ the time per token they added
    (None when the checkpointed step was not slower, so no time can be put on them)."""
    extra_s = 1 / u["tokens_per_s"]["checkpointed"] - 1 / u["tokens_per_s"]["plain"]
    extra_flops = u["hardware_flops"]["checkpointed"] - u["model_flops"]
    return extra_flops / extra_s if extra_s > 0 else None


def findings(ledger: Ledger, peak: dict, u: dict) -> Findings:
    recompute = u["hardware_flops"]["checkpointed"] / u["model_flops"]
    ledger.add("hfu_recompute", "With per-block checkpointing the hardware computes more than the model needs, but "
               "less than one extra forward: the head is not recomputed, nor each block's last product (hardware ÷ "
               "model FLOPs, counted; a whole extra forward would be 8P/6P = 4/3)",
               recompute, between(1.01, 4 / 3), kind="counted")
    ledger.add("recompute_lowers_mfu", "Recomputation is not free: a checkpointed step, the same model FLOPs, takes "
               "longer, so MFU falls (checkpointed ÷ plain step time, median of adjacent pairs, measured; 1 would be "
               "free recomputation)", u["step_ratio"], at_least(1.05), kind="measured")
    ledger.note("matmul_flops_per_s", {k: v["by_size"] for k, v in peak.items()})
    ledger.note("step_seconds", u["step_seconds"])
    rate = recompute_rate(u)
    ledger.note("mfu_hfu", {"mfu": u["mfu"], "mfu_checkpointed": u["mfu_checkpointed"],
                            "hfu_checkpointed": u["hfu_checkpointed"], "recompute_flops_per_s": rate})
    dev = pick_device()
    hfu_vs_plain = u["hfu_checkpointed"] / u["mfu"]  # without recomputation HFU is MFU
    if hfu_vs_plain < 0.95:
        hfu = ("HFU, which counts the recomputed FLOPs too, fell as well: the recomputed forward ran slower per FLOP "
               "than the step as a whole. On a bigger model, where products dominate, it nearly keeps pace (the `cpu` "
               "profile).")
    elif hfu_vs_plain <= 1.05:
        hfu = ("HFU, which counts the recomputed FLOPs too, stayed near the plain step's: the recomputed forward ran "
               "about as fast as the rest. HFU is not a score that recomputation raises.")
    else:
        hfu = ("HFU, which counts the recomputed FLOPs too, rose above the plain step's: the recomputed forward ran "
               "faster per FLOP than the step as a whole.")
    mfu_words = (f"Recomputing activations lowered MFU to **{u['mfu_checkpointed']:.0%}**: the same model FLOPs took "
                 "longer." if u["step_ratio"] > 1 else "Recomputing activations did not lower MFU here, which timing noise "
                 "can do on a busy machine: run it again.")
    step_rate = u["tokens_per_s"]["plain"] * u["model_flops"]
    table = ("| step | tokens/s | MFU | HFU |\n|---|---|---|---|\n"
             f"| plain | {u['tokens_per_s']['plain']:,.0f} | {u['mfu']:.1%} | {u['mfu']:.1%} |\n"
             f"| checkpointed | {u['tokens_per_s']['checkpointed']:,.0f} | {u['mfu_checkpointed']:.1%} | "
             f"{u['hfu_checkpointed']:.1%} |")
    return Findings([
        f"Far from all of it: a training step of this small model ran at **MFU {u['mfu']:.0%}** of the best rate "
        "matrix products reach here.",
        mfu_words,
        hfu,
    ], [
        f"The best fp32 matrix-product rate here, the peak these shares divide by: "
        f"{peak['fp32']['peak'] / 1e9:.1f} GFLOP/s" + (" on one core, as the steps ran" if dev.type == "cpu" else "")
        + f"; {bf16_words(dev, peak)}.",
        table,
        f"The checkpointed step computed {recompute:.2f}× the model's FLOPs, less than a whole extra forward: the head "
        "is not recomputed, and a block's recomputation stops once backward has what it needs, before its last "
        "product.",
        (f"The recomputed work ran at {rate / 1e9:.1f} GFLOP/s, the plain step at {step_rate / 1e9:.1f}." if rate
         else "The checkpointed step was not slower here: timing noise hid the recomputation's cost."),
    ])
