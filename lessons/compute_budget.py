"""Lesson 12 — the compute budget: FLOPs per token, MFU on your own machine, an isoFLOP sweep, training time.

Experiments for notebooks/12_compute_budget.ipynb. Per-profile settings live in PROFILES; the planning arithmetic
(training_flops, training_seconds, training_cost, PUBLISHED) is in labtools/plan.py; the weak-scaling ranks are in
lessons/ranks/compute_budget.py.
"""

import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from labtools import plots
from labtools.claims import Ledger, approx, at_least, at_most, between
from labtools.data import text
from labtools.device import pick_device
from labtools.dist import launch
from labtools.model import GPT, GPTConfig
from labtools.plan import CLUSTERS, PUBLISHED, training_cost, training_days, training_flops, training_seconds
from labtools.profiles import check_range, resolve
from labtools.progress import progress
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, train
from labtools.widgets import Exercise, Panel, RunCache, answer_check, slider
from lessons.ranks import compute_budget as ranks
from lessons.ranks.compute_budget import ScalingJob

TIMEOUT_S = 300
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: ≈ 20 tokens per parameter at the compute optimum


@dataclass(frozen=True)
class Settings:
    profile: str
    shapes: tuple          # (n_layer, n_embd, n_head, seq) of the models whose FLOPs are counted
    n_layer: int           # the timed model (MFU, HFU)
    n_embd: int
    n_head: int
    block_size: int
    batch_size: int
    time_rounds: int       # alternating rounds of plain and checkpointed steps
    time_steps: int        # steps per round
    matmul_sizes: tuple    # n of the n×n matrix products that measure the peak
    budgets: tuple         # isoFLOP budgets, FLOPs per run
    widths: tuple          # n_embd of the sweep's models (n_layer = sweep_layers, heads of 16, at least one)
    sweep_layers: int
    sweep_batch: int
    sweep_block: int
    sweep_lr: float
    scaling_steps: int     # steps per round of the weak-scaling launch
    scaling_world: int
    seed: int = 0

    def __post_init__(self):
        check_range("TIME_ROUNDS", self.time_rounds, 1, 100, int)
        check_range("TIME_STEPS", self.time_steps, 1, 1000, int)
        check_range("SWEEP_LR", self.sweep_lr, 1e-5, 1.0)
        check_range("SCALING_STEPS", self.scaling_steps, 1, 1000, int)
        check_range("SCALING_WORLD", self.scaling_world, 2, 8, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if len(self.budgets) < 2 or min(self.budgets) <= 0 or list(self.budgets) != sorted(set(self.budgets)):
            raise ValueError(f"BUDGETS must be at least two increasing FLOP counts > 0, got {self.budgets!r}")
        if len(self.widths) < 3 or any(not isinstance(w, int) or w % 8 or w < 8 for w in self.widths):
            raise ValueError(f"WIDTHS must be at least three multiples of 8, got {self.widths!r}")
        for L, d, h, T in self.shapes:
            if d % h:
                raise ValueError(f"shape {(L, d, h, T)}: n_embd must be a multiple of n_head")


PROFILES = {
    "smoke": Settings("smoke", shapes=((2, 64, 4, 64), (4, 128, 4, 128), (3, 96, 6, 256)), n_layer=2, n_embd=64,
                      n_head=4, block_size=64, batch_size=16, time_rounds=3, time_steps=4, matmul_sizes=(256, 512),
                      budgets=(3e9, 1e10), widths=(8, 16, 32, 64), sweep_layers=2, sweep_batch=16, sweep_block=32,
                      sweep_lr=1e-2, scaling_steps=4, scaling_world=2),
    "cpu": Settings("cpu", shapes=((2, 64, 4, 64), (4, 128, 4, 128), (6, 192, 6, 256)), n_layer=4, n_embd=128,
                    n_head=4, block_size=128, batch_size=16, time_rounds=5, time_steps=5,
                    matmul_sizes=(256, 512, 1024), budgets=(3e9, 1e10, 3e10, 1e11), widths=(8, 16, 32, 64),
                    sweep_layers=2, sweep_batch=16, sweep_block=32, sweep_lr=1e-2, scaling_steps=8, scaling_world=2),
    "gpu": Settings("gpu", shapes=((2, 64, 4, 64), (12, 768, 12, 1024), (24, 1024, 16, 1024)), n_layer=12,
                    n_embd=768, n_head=12, block_size=1024, batch_size=8, time_rounds=5, time_steps=10,
                    matmul_sizes=(1024, 4096, 8192), budgets=(1e13, 3e13, 1e14), widths=(64, 128, 192, 256, 384),
                    sweep_layers=4, sweep_batch=32, sweep_block=256, sweep_lr=3e-3, scaling_steps=10,
                    scaling_world=2),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus():
    return text()


def gpt(n_layer: int, n_embd: int, n_head: int, seq: int, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=corpus().vocab_size, block_size=seq, n_layer=n_layer, n_head=n_head,
                         n_embd=n_embd, **kw)).to(pick_device())


# --- 1. FLOPs per token: three formulas and the counter ---------------------------------------------------------

def formulas(model: GPT, seq: int) -> dict[str, float]:
    """Training FLOPs per token of the lab's GPT by three conventions, all 6·N + 12·L·T·d with a different N.

    matmul weights: the weights that multiply activations — 12·L·d² in the blocks plus the head V·d (tied to the
        token embedding, so it is one matrix used twice: a lookup, which costs nothing, and the output product).
    all parameters (picotron's get_mfu): adds the position embedding, biases and LayerNorms, which do no
        matrix products.
    without embeddings (torchtitan's get_num_flop_per_token): drops the token embedding — which here is also the
        head, so the output product goes missing.
    """
    c = model.config
    attention = 12 * c.n_layer * seq * c.n_embd
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    total = model.num_params()
    return {"matmul weights": 6 * matmul + attention, "all parameters (picotron)": 6 * total + attention,
            "without the token embedding (torchtitan)": 6 * (total - model.transformer.wte.weight.numel()) + attention}


def counted_flops(model: GPT, seq: int, batch: int = 2, seed: int = 0, fused: bool = False) -> dict[str, float]:
    """FLOPs per token of one forward and of one forward + backward, counted by FlopCounterMode (matrix products and
    attention; elementwise work, softmax and LayerNorm are not counted — nor by the formulas).

    Attention runs on PyTorch's math backend here, whose batched products the counter sees. fused=True keeps the
    default kernel: FlopCounterMode has FLOP formulas for the CUDA flash/efficient/cuDNN kernels but none for the
    CPU's fused kernel (torch 2.11-2.13), so on a CPU its attention counts as zero."""
    g = torch.Generator().manual_seed(seed)
    X, Y = (torch.randint(model.config.vocab_size, (batch, seq), generator=g).to(pick_device()) for _ in range(2))
    with nullcontext() if fused else sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd:
            model(X, Y)
        with FlopCounterMode(display=False) as both:
            model(X, Y)[1].backward()
    model.zero_grad(set_to_none=True)
    by_op = {str(op): n / (batch * seq) for op, n in both.get_flop_counts()["Global"].items()}
    return {"forward": fwd.get_total_flops() / (batch * seq), "train": both.get_total_flops() / (batch * seq),
            "by_op": by_op}


def flop_counts(S: Settings) -> list[dict]:
    """For every shape: parameters, the three formulas and the counted FLOPs per token."""
    rows = []
    for L, d, h, T in S.shapes:
        model = gpt(L, d, h, T, S.seed)
        rows.append({"shape": (L, d, h, T), "n_params": model.num_params(), "formulas": formulas(model, T),
                     **counted_flops(model, T, seed=S.seed),
                     "train_fused": counted_flops(model, T, seed=S.seed, fused=True)["train"]})
    return rows


def flops_table(rows: list[dict]) -> go.Figure:
    names = list(rows[0]["formulas"])
    header = (["model (L, d, heads, T)", "parameters", "counted (FlopCounterMode)", "counted, default attention kernel"]
              + [f"6N + 12LTd, N = {n}" for n in names])
    body = [[f"{r['shape']}", f"{r['n_params']:,}", f"{r['train']:,.0f}", f"{r['train_fused']:,.0f}"]
            + [f"{r['formulas'][n]:,.0f} ({r['formulas'][n] / r['train'] - 1:+.1%})" for n in names] for r in rows]
    return plots.table(header, body, title="Training FLOPs per token: counted vs three conventions")


def flops_findings(ledger: Ledger, rows: list[dict]) -> str:
    exact = max(abs(r["formulas"]["matmul weights"] / r["train"] - 1) for r in rows)
    ledger.add("flops_formula", f"6N + 12LTd with N = the matrix weights (tied head counted once) equals "
               f"FlopCounterMode's count of a training step, {len(rows)} shapes (largest relative difference, "
               "measured)", exact, at_most(1e-9), kind="measured")
    ratio = [r["train"] / r["forward"] for r in rows]
    ledger.add("backward_2x", "Backward costs twice the forward (train ÷ forward FLOPs, counted, every shape)",
               max(abs(x - 3) for x in ratio), at_most(1e-9), kind="measured")
    over = [r["formulas"]["all parameters (picotron)"] / r["train"] - 1 for r in rows]
    under = [r["formulas"]["without the token embedding (torchtitan)"] / r["train"] - 1 for r in rows]
    # what each convention adds or drops, from the parameter counts: the gap to the counter must be 6× exactly that
    idle = [r["n_params"] - (r["formulas"]["matmul weights"] - 12 * r["shape"][0] * r["shape"][3] * r["shape"][1]) / 6
            for r in rows]  # parameters that do no products: position embedding, biases, LayerNorms
    head = [r["n_params"] - (r["formulas"]["without the token embedding (torchtitan)"]
                             - 12 * r["shape"][0] * r["shape"][3] * r["shape"][1]) / 6 for r in rows]  # V·d
    ledger.add("picotron_gap", "Counting every parameter (picotron) overstates the count by exactly 6 × the "
               "parameters that do no products (position embedding, biases, LayerNorms), every shape (largest "
               "|gap − 6 × those|, FLOPs/token, computed vs counted)",
               max(abs(r["formulas"]["all parameters (picotron)"] - r["train"] - 6 * i) for r, i in zip(rows, idle)),
               at_most(1e-6), kind="measured")
    ledger.add("torchtitan_gap", "Dropping the token embedding (torchtitan) misses by exactly 6 × (those parameters "
               "− the tied head's V·d): it drops a matrix that does a product here and keeps ones that do none "
               "(largest |gap − 6 × (those − V·d)|, computed vs counted)",
               max(abs(r["formulas"]["without the token embedding (torchtitan)"] - r["train"] - 6 * (i - h))
                   for r, i, h in zip(rows, idle, head)), at_most(1e-6), kind="measured")
    big = rows[-1]
    attention = [12 * r["shape"][0] * r["shape"][3] * r["shape"][1] for r in rows]
    missing = [r["train"] - r["train_fused"] for r in rows]
    ledger.add("fused_attention", "With the default attention kernel the counter sees either all of attention or "
               "none of it (FLOPs missing ÷ 12LTd, every shape, measured: 0 where the kernel has a FLOP formula, "
               "1 where it has none)", max(min(abs(m / a), abs(m / a - 1)) for m, a in zip(missing, attention)),
               at_most(1e-9), kind="measured")
    ledger.note("flops_per_token", [{"shape": r["shape"], "counted": r["train"], "counted_default_kernel":
                                     r["train_fused"], **r["formulas"]} for r in rows])
    unseen = all(m == a for m, a in zip(missing, attention))
    kernel = (" One trap, measured: with the default attention kernel on this machine the counter saw **none** of "
              f"attention ({big['train_fused']:,.0f} per token for {big['shape']}) — FlopCounterMode has FLOP formulas "
              "for the CUDA flash, memory-efficient and cuDNN kernels, but none for the CPU's fused kernel, so its "
              "work is silently counted as zero. The counts above run attention on PyTorch's math backend, whose "
              "batched products it does see." if unseen else
              " With the default attention kernel the counter saw attention too (it has a FLOP formula for this "
              "device's kernel); on a CPU it has none, and counts the fused kernel as zero.")
    return (f"FlopCounterMode counted **{big['train']:,.0f}** FLOPs per token for {big['shape']} "
            f"(forward {big['forward']:,.0f}: backward is exactly 2× the forward — one product for the input's "
            "gradient, one for the weight's). The formula matches it exactly once N is the set of weights that "
            "multiply activations. The published conventions miss on models this small: all parameters "
            f"(picotron) by {fmt_range(over)} — it counts the position embedding, biases and LayerNorms, which do "
            f"no products; all but the token embedding (torchtitan) by {fmt_range(under)} — it drops the token "
            "embedding, which here *is* the output head (tied) and does a product, and keeps the position "
            "embedding, which does none; the two errors partly cancel. (A Llama has no learned position embedding "
            "and an untied head, so torchtitan's convention is right for its own models.) At billions of "
            "parameters all three agree to a fraction of a percent. All count attention as if the causal mask did "
            "not skip half of it, as the counter does: 12·L·T·d is what an un-masked kernel computes." + kernel)


def fmt_range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:+.1%}" if abs(hi - lo) < 5e-4 else f"{lo:+.1%} to {hi:+.1%}"


# --- 2. peak and MFU on this machine -----------------------------------------------------------------------------

def matmul_peak(S: Settings) -> dict[str, dict]:
    """Achieved FLOP/s of n×n matrix products, fp32 and bf16, best over sizes and repeats: the 'peak' MFU is
    measured against here (a vendor's peak on a GPU; a CPU has no honest published one)."""
    dev = pick_device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = {}
    for name, dtype in progress((("fp32", torch.float32), ("bf16", torch.bfloat16)), desc="matmul peak"):
        rates = {}
        for n in S.matmul_sizes:
            a = torch.randn(n, n, device=dev).to(dtype)
            b = torch.randn(n, n, device=dev).to(dtype)
            a @ b
            best = math.inf
            for _ in range(3):
                sync()
                t0 = time.perf_counter()
                a @ b
                sync()
                best = min(best, time.perf_counter() - t0)
            rates[n] = 2 * n**3 / best
        out[name] = {"by_size": rates, "peak": max(rates.values())}
    return out


def utilisation(S: Settings, peak: dict) -> dict:
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


def utilisation_figure(peak: dict, u: dict) -> go.Figure:
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


def utilisation_findings(ledger: Ledger, peak: dict, u: dict) -> str:
    recompute = u["hardware_flops"]["checkpointed"] / u["model_flops"]
    ledger.add("mfu_below_one", "A training step's model FLOP/s stay below the matrix-product peak measured beside "
               "it (MFU, measured)", u["mfu"], between(0, 1), kind="measured")
    ledger.add("hfu_recompute", "With per-block checkpointing the hardware does more than the model needs, but less "
               "than one extra forward (hardware ÷ model FLOPs, counted; 8N/6N = 4/3 would be a whole forward)",
               recompute, between(1.01, 4 / 3), kind="measured")
    ledger.note("matmul_flops_per_s", {k: v["by_size"] for k, v in peak.items()})
    ledger.note("tokens_per_s", u["rounds"])
    ledger.note("mfu_hfu", {"mfu": u["mfu"], "mfu_checkpointed": u["mfu_checkpointed"],
                            "hfu_checkpointed": u["hfu_checkpointed"]})
    dev = pick_device()
    return (f"Measured on this {dev.type.upper()}: matrix products reach **{peak['fp32']['peak'] / 1e9:.1f} GFLOP/s** "
            f"in fp32 and {peak['bf16']['peak'] / 1e9:.1f} in bf16 ({bf16_words(dev, peak)}). A training step of the "
            f"{u['model_flops']:,.0f}-FLOP/token model ran at {u['tokens_per_s']['plain']:,.0f} tokens/s: "
            f"**MFU {u['mfu']:.1%}** of the fp32 peak. Small matrices, Python overhead, elementwise work and the "
            "optimizer all take time that does no counted FLOPs. With checkpointing the step did "
            f"{recompute:.2f}× the model's FLOPs, so its HFU ({u['hfu_checkpointed']:.1%}) is above its MFU "
            f"({u['mfu_checkpointed']:.1%}): MFU does not reward recomputation, which is why PaLM reported it "
            "(540B: 46.2% MFU, 57.8% HFU — Chowdhery et al. 2022, table 3).")


# --- 3. an isoFLOP sweep -------------------------------------------------------------------------------------------

def _sweep_run(width: int, budget: float, layers: int, batch: int, block: int, lr: float, seed: int) -> dict:
    """Train a `layers`-deep GPT of width `width` (16-wide heads) for `budget` FLOPs: steps = budget ÷ the FLOPs
    of a step (6N + 12LTd per token, N the matrix weights — exact, section 1), cosine to 10% after a 10% warm-up."""
    model = gpt(layers, width, max(1, width // 16), block, seed)
    fpt = formulas(model, block)["matmul weights"]
    steps = max(1, round(budget / (fpt * batch * block)))
    schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    cfg = TrainConfig(steps=steps, batch_size=batch, block_size=block, lr=lr, eval_every=steps, eval_batches=8,
                      lr_schedule=schedule, seed=seed, progress=False)
    hist = train(model, corpus(), cfg)
    return {"width": width, "budget": budget, "n_params": model.num_params(), "steps": steps,
            "tokens": steps * batch * block, "flops": steps * batch * block * fpt, "val_loss": hist.final_val_loss}


SWEEP = RunCache(_sweep_run)  # one training run per configuration: the panel redraws from here


def sweep(S: Settings) -> list[dict]:
    """Every width at every budget, each model trained on its budget's FLOPs."""
    configs = [dict(width=w, budget=b, layers=S.sweep_layers, batch=S.sweep_batch, block=S.sweep_block,
                    lr=S.sweep_lr, seed=S.seed) for b in S.budgets for w in S.widths]
    return [SWEEP(**c) for c in progress(configs, desc="isoFLOP sweep")]


def fit(runs: list[dict]) -> dict[float, dict]:
    """Per budget: a parabola of val loss in log N through its runs, and its minimum — the loss-optimal size —
    with the tokens that budget then buys and D/N. A minimum outside the
    sizes tried (or a parabola that opens downward) is reported as such, with the best run instead. N counts every
    parameter and D = C ÷ 6N, as Chinchilla counts them."""
    out = {}
    for budget in sorted({r["budget"] for r in runs}):
        rs = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["n_params"])
        x = np.log([r["n_params"] for r in rs])
        y = np.array([r["val_loss"] for r in rs])
        a, b, c = np.polyfit(x, y, 2)
        best = rs[int(np.argmin(y))]
        interior = a > 0 and x[0] < -b / (2 * a) < x[-1]
        n_opt = float(np.exp(-b / (2 * a))) if interior else float(best["n_params"])
        tokens = budget / (6 * n_opt)  # Chinchilla's accounting, C = 6·N·D
        out[budget] = {"coef": (float(a), float(b), float(c)), "interior": bool(interior), "n_opt": n_opt,
                       "tokens": tokens, "tokens_per_param": tokens / n_opt, "best": best}
    return out


def sweep_figure(runs: list[dict], fits: dict[float, dict], highlight: float | None = None) -> go.Figure:
    fig = go.Figure()
    for i, (budget, f) in enumerate(fits.items()):
        rs = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["n_params"])
        on = highlight is None or budget == highlight
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=[r["n_params"] for r in rs], y=[r["val_loss"] for r in rs], mode="markers",
                                 marker=dict(color=c, size=9), opacity=1 if on else 0.3, name=f"{budget:.0e} FLOPs"))
        xs = np.linspace(np.log(rs[0]["n_params"]), np.log(rs[-1]["n_params"]), 60)
        fig.add_trace(go.Scatter(x=np.exp(xs), y=np.polyval(f["coef"], xs), mode="lines", showlegend=False,
                                 line=dict(color=c, dash="dot", width=2 if on else 1), opacity=1 if on else 0.3))
        if f["interior"]:
            fig.add_trace(go.Scatter(x=[f["n_opt"]], y=[float(np.polyval(f["coef"], np.log(f["n_opt"])))],
                                     mode="markers", marker=dict(color=c, symbol="star", size=15), showlegend=False,
                                     opacity=1 if on else 0.3, hovertext=f"N_opt ≈ {f['n_opt']:,.0f}, D/N ≈ "
                                     f"{f['tokens_per_param']:.1f}"))
    plots.style(fig, title="isoFLOP curves: val loss after a fixed compute budget (★ the fitted optimum)",
                xaxis="parameters N", yaxis="val loss (nats/char)", height=420)
    fig.update_xaxes(type="log")
    return fig


def sweep_panel(runs: list[dict], fits: dict[float, dict]) -> Panel:
    """Pick a budget: its isoFLOP curve stands out (from the cached runs: no training)."""
    budgets = list(fits)
    choice = W.Dropdown(options=[(f"{b:.0e} FLOPs", b) for b in budgets], value=budgets[-1],
                        description="budget")
    return Panel(lambda budget: sweep_figure(runs, fits, budget), {"budget": choice}, title="isoFLOP curves")


def sweep_findings(ledger: Ledger, S: Settings, runs: list[dict], fits: dict[float, dict]) -> str:
    # steps = round(budget ÷ FLOPs per step): within half a step by construction, so a note (the exactness of the
    # FLOPs per step itself is section 1's claim, against the counter)
    ledger.note("budget_spent", max(abs(r["flops"] / r["budget"] - 1) for r in runs))
    best = [fits[b]["best"]["val_loss"] for b in S.budgets]
    ledger.add("more_compute_lower_loss", "More compute, lower loss: each budget's best run beats the smaller "
               "budget's best (largest difference best(C_i+1) − best(C_i), measured)",
               max(b - a for a, b in zip(best, best[1:])), at_most(0), kind="measured")
    largest = {b: max((r for r in runs if r["budget"] == b), key=lambda r: r["n_params"]) for b in S.budgets}
    small = S.budgets[0]
    ledger.add("biggest_not_best", "At the smallest budget the largest model is not the best one (its val loss − "
               "the best run's, measured): at a fixed budget a bigger model sees too few tokens",
               largest[small]["val_loss"] - fits[small]["best"]["val_loss"], at_least(0.01), kind="measured")
    ledger.note("isoflop_runs", runs)
    ledger.note("isoflop_fits", {f"{b:.0e}": {k: v for k, v in f.items() if k != "best"} for b, f in fits.items()})
    lines = []
    for b, f in fits.items():
        where = (f"the fitted optimum is N ≈ {f['n_opt']:,.0f}, which buys D ≈ {f['tokens']:,.0f} tokens: "
                 f"**{f['tokens_per_param']:.1f} tokens per parameter**") if f["interior"] else (
                 f"the parabola has no minimum inside the sizes tried; the best run was N = "
                 f"{f['best']['n_params']:,} ({f['best']['tokens'] / f['best']['n_params']:.1f} tokens per parameter)")
        lines.append(f"* {b:.0e} FLOPs: {where}.")
    inside = [(b, f["n_opt"]) for b, f in fits.items() if f["interior"]]
    if len(inside) >= 2:  # how the optimum moves with compute: N_opt ∝ C^a
        a = float(np.polyfit(np.log([b for b, _ in inside]), np.log([n for _, n in inside]), 1)[0])
        ledger.note("n_opt_exponent", a)
        lines.append(f"\nAcross the budgets with a fitted optimum, N_opt grows as C^{a:.2f} here (Chinchilla: "
                     "≈ C^0.50, so that N and D grow alike).")
    return ("\n".join(lines) + f"\n\nChinchilla (Hoffmann et al. 2022) found ≈ {CHINCHILLA_TOKENS_PER_PARAM} tokens "
            "per parameter at the optimum, fitted over 400+ models from 70M to 16B parameters and budgets up to "
            "~10²⁴ FLOPs. What a laptop sweep can show: the isoFLOP *shape* — at a fixed budget, too small a model "
            "underfits and too large a one sees too few tokens, so loss has a minimum in N — and that more compute "
            "buys lower loss. What it cannot show: the ratio itself. At a few thousand steps the learning-rate "
            "schedule, the warm-up and the embedding share of N (large here, negligible at scale) move the optimum "
            "by more than the effect being fitted, and a character-level corpus is not web text. Treat the "
            "tokens-per-parameter above as this machine's number for this toy, not a check of 20.")


# --- 4. training time: the calculator, the published runs, and scaling efficiency --------------------------------

def published() -> dict[str, dict]:
    """The published runs recomputed: 6·N·D against the published FLOPs; GPT-3's time from Narayanan et al.'s
    8·T·P/(n·X) (their 140 teraFLOP/s per A100, recomputation included) and the same run as 6ND at the MFU it
    implies."""
    out = {}
    for name, run in PUBLISHED.items():
        flops = training_flops(run.n_params, run.tokens)
        row = {"flops": flops, "published_flops": run.flops, "flops_ratio": flops / run.flops, "source": run.source}
        if run.achieved_flops:
            row["days"] = training_days(run.n_params, run.tokens, run.gpus, run.achieved_flops, recompute=True)
            row["published_days"] = run.days
            row["hfu"] = run.achieved_flops / run.peak_flops
            row["mfu"] = row["hfu"] * 6 / 8  # the recomputed forward is a third of 8N: not model FLOPs
            row["days_at_mfu"] = training_seconds(flops, run.gpus, run.peak_flops, row["mfu"]) / 86400
        out[name] = row
    return out


def published_findings(ledger: Ledger, rows: dict[str, dict]) -> str:
    g, ll = rows["GPT-3 175B"], rows["Llama 3 405B"]
    ledger.add("gpt3_flops", "GPT-3 175B on 300B tokens: 6·N·D = the published 3.14e23 FLOPs (computed ÷ published)",
               g["flops_ratio"], approx(1, rel=0.02), source=g["source"], kind="computed")
    ledger.add("gpt3_days", "… on 1024 A100s at 140 teraFLOP/s each: ≈ 34 days (8·T·P/(n·X), computed)",
               g["days"], approx(34, rel=0.02), source="Narayanan et al. 2021", kind="computed")
    # 6ND at HFU × 6/8 is 8ND at HFU, algebraically: a note, not a claim that could fail
    ledger.note("gpt3_days_at_implied_mfu", {"mfu": g["mfu"], "days": g["days_at_mfu"]})
    ledger.add("llama3_flops", "Llama 3 405B on 15.6T tokens: 6·N·D = the published 3.8e25 FLOPs (computed ÷ "
               "published)", ll["flops_ratio"], approx(1, rel=0.02), source=ll["source"], kind="computed")
    return (f"GPT-3: 6 × 175e9 × 300e9 = **{g['flops']:.3g}** FLOPs (published {g['published_flops']:.3g}). Narayanan "
            f"et al. estimate ≈ 34 days on 1024 A100s sustaining 140 teraFLOP/s each; their formula 8·T·P/(n·X) "
            f"gives **{g['days']:.1f} days**. The 8 instead of 6 is the recomputed forward: 140 of the A100's 312 "
            f"teraFLOP/s is {g['hfu']:.1%} *hardware* utilisation, which is {g['mfu']:.1%} *model* utilisation — and "
            f"6ND at {g['mfu']:.1%} MFU gives the same {g['days_at_mfu']:.1f} days. Llama 3 405B: 6 × 405e9 × "
            f"15.6e12 = **{ll['flops']:.3g}** FLOPs (published {ll['published_flops']:.2g}).")


def calculator_figure(n_params_b: float, tokens_b: float, gpus: int, gpu: str, mfu: float,
                      dollars_per_gpu_hour: float) -> go.Figure:
    """Days against the number of GPUs for this run (6·N·D at the given MFU), the chosen point marked. (No dollar
    signs in a plotly title: two of them make it a LaTeX string, which JupyterLab's plotly drew as nothing.)"""
    cluster = CLUSTERS[gpu]
    flops = training_flops(n_params_b * 1e9, tokens_b * 1e9)
    seconds = training_seconds(flops, gpus, cluster.peak_flops, mfu)
    cost = training_cost(seconds, gpus, dollars_per_gpu_hour)
    counts = np.unique(np.round(np.logspace(0, 5, 60)).astype(int))
    days = [training_seconds(flops, int(n), cluster.peak_flops, mfu) / 86400 for n in counts]
    fig = go.Figure(go.Scatter(x=counts, y=days, mode="lines", name="days (perfect scaling)",
                               line=dict(color=plots.color(0))))
    fig.add_trace(go.Scatter(x=[gpus], y=[seconds / 86400], mode="markers", marker=dict(size=14, color=plots.color(1)),
                             name=f"{gpus:,} GPUs"))
    plots.style(fig, title=f"{flops:.3g} FLOPs → {seconds / 86400:,.1f} days on {gpus:,} GPUs at {mfu:.0%} MFU<br>"
                f"{cost / 1e6:,.2f} million USD at {dollars_per_gpu_hour:g} USD/GPU-hour", xaxis="GPUs", yaxis="days",
                height=400)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def calculator_panel() -> Panel:
    controls = {
        "n_params_b": slider(175.0, 0.1, 2000.0, description="parameters (B)", log=True),
        "tokens_b": slider(300.0, 1.0, 100_000.0, description="tokens (B)", log=True),
        "gpus": W.IntText(value=1024, description="GPUs"),
        "gpu": W.Dropdown(options=list(CLUSTERS), value=list(CLUSTERS)[0], description="GPU"),
        "mfu": slider(0.4, 0.05, 1.0, 0.01, description="MFU"),
        "dollars_per_gpu_hour": slider(2.0, 0.5, 10.0, 0.1, description="USD / GPU-hour"),
    }
    return Panel(calculator_figure, controls, title="Training time and cost")


def weak_scaling(S: Settings) -> dict:
    """Launch S.scaling_world gloo/NCCL ranks: rank 0 alone vs all of them under DDP, the same rows per rank."""
    job = ScalingJob(n_layer=S.n_layer, n_embd=S.n_embd, n_head=S.n_head, block_size=S.block_size,
                     batch_size=S.batch_size, steps=S.scaling_steps, seed=S.seed)
    res = launch(ranks.weak_scaling, S.scaling_world, job, desc=f"weak scaling × {S.scaling_world}",
                 timeout_s=TIMEOUT_S)
    r0 = res[0]
    solo, ddp = statistics.median(r0["solo_tokens_per_s"]), statistics.median(r0["ddp_tokens_per_s"])
    return {"world": S.scaling_world, "backend": r0["dist"]["backend"], "solo": solo, "ddp": ddp,
            "efficiency": ddp / (S.scaling_world * solo), "rounds": r0}


def scaling_findings(ledger: Ledger, w: dict) -> str:
    ledger.note("weak_scaling", w)
    ledger.add("weak_scaling", "The articles' unmeasured 'scaling efficiency of 60–80%', replaced by this machine's: "
               f"DDP's weak-scaling efficiency at {w['world']} ranks (tokens/s of all ranks ÷ {w['world']} × one rank "
               "alone, medians of alternating rounds; bounded by 1 unless the measurement is broken)",
               w["efficiency"], between(0.05, 1.1), source="the source articles (60–80%)", kind="measured")
    where = ("CPU ranks (gloo) sharing this machine's cores and memory bandwidth: what is lost here is mostly "
             "contention, plus the gradient all-reduce" if w["backend"] == "gloo" else
             "GPUs (NCCL): what is lost is the gradient all-reduce not hidden behind backward")
    return (f"The source articles divide the ideal time by a 'scaling efficiency' of typically 60–80%, without a "
            f"measurement. Measured here, {w['world']} {where}: one rank alone trained "
            f"{w['solo']:,.0f} tokens/s; {w['world']} ranks together, each with the same batch, "
            f"{w['ddp']:,.0f} tokens/s — **{w['efficiency']:.0%} weak-scaling efficiency**. It is a number for this "
            "machine and this model (under a million parameters, a few megabytes of gradients per step), not for "
            "a cluster: there, efficiency depends on the network, the overlap of communication with "
            "backward, and the parallel layout (lesson 10's planner puts numbers on those).")


def exercises(ledger: Ledger) -> list[Exercise]:
    h100 = CLUSTERS[[k for k in CLUSTERS if k.startswith("H100")][0]]
    n, tokens = 70e9, 20 * 70e9
    flops = training_flops(n, tokens)
    days = training_seconds(flops, 2048, h100.peak_flops, 0.4) / 86400
    ledger.note("exercise_answers", {"tokens": tokens, "flops": flops, "days": days})  # computed, as the panel does
    return [Exercise(
        "Chinchilla-optimal 70B", "A Chinchilla-optimal 70B model (20 tokens per parameter) on 2048 H100s "
        "(989 teraFLOP/s dense bf16) at 40% MFU: how many tokens (billions), how many FLOPs (in units of 1e23), "
        "how many days?",
        {"tokens_b": "tokens (B)", "flops_e23": "FLOPs (1e23)", "days": "days"},
        answer_check({"tokens_b": tokens / 1e9, "flops_e23": flops / 1e23, "days": days}, rel=0.02),
        f"D = 20 × 70e9 = 1.4e12 tokens; C = 6·N·D = 6 × 70e9 × 1.4e12 = {flops:.3g} FLOPs; time = C ÷ (2048 × "
        f"989e12 × 0.4) = {days * 86400:,.0f} s = **{days:.1f} days**. (Chinchilla itself, 70B on 1.4T tokens, "
        "was trained on TPUs.)")]


def calculator_findings(ledger: Ledger, redraw_ms: float) -> str:
    ledger.note("calculator_redraw_ms", redraw_ms)
    return (f"Redraw time, measured here (kernel side, median): {redraw_ms:.0f} ms. The calculator is 6·N·D at the "
            "MFU you choose: the attention term adds 12·L·T·d per token (a few percent at 2–8k context for these "
            "sizes), and recomputation does not appear at all — it lowers the MFU you can reach instead.")
