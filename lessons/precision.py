"""Lesson 04 — mixed precision: number formats, fp16 overflow and underflow, loss scaling, bf16 and
why the master weights stay in fp32.

Experiments for notebooks/04_mixed_precision.ipynb. Per-profile settings live in PROFILES.
"""

import copy
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn as nn
import torch.nn.functional as F
from plotly.subplots import make_subplots

from labtools import data, plots
from labtools.claims import Ledger, approx, at_least, at_most, between, is_true
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.precision import FORMATS, DynamicLossScaler, decompose
from labtools.profiles import check_range, resolve
from labtools.progress import progress
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, StepInfo, TrainConfig, autocast, train
from labtools.widgets import Panel, slider


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int
    scaling_steps: int     # length of each loss-scaling run
    shrink_exp: int        # gradients are multiplied by 2^-shrink_exp (a large model's gradient scale)
    growth_interval: int   # the dynamic scaler's (GradScaler's default is 2000; short here to see cycles)
    master_steps: int      # length of the fp32-master vs pure-bf16 runs
    master_lr: float
    speed_steps: int       # timed training steps per precision
    matmul_size: int = 1024  # n of the timed n×n matrix products
    seed: int = 0

    def __post_init__(self):
        check_range("SCALING_STEPS", self.scaling_steps, 20, 1_000_000, int)
        check_range("SHRINK_EXP", self.shrink_exp, 0, 60, int)
        check_range("GROWTH_INTERVAL", self.growth_interval, 1, 100_000, int)
        check_range("MASTER_STEPS", self.master_steps, 40, 1_000_000, int)
        check_range("MASTER_LR", self.master_lr, 1e-6, 1.0)
        check_range("SPEED_STEPS", self.speed_steps, 1, 1000, int)
        check_range("MATMUL_SIZE", self.matmul_size, 16, 16384, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)


PROFILES = {
    # smoke keeps the reduced-precision runs small: a CPU without bf16/fp16 units emulates those products
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=32, batch_size=16, scaling_steps=50, shrink_exp=16,
                      growth_interval=5, master_steps=64, master_lr=1e-3, speed_steps=3, matmul_size=512),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, scaling_steps=300, shrink_exp=16,
                    growth_interval=10, master_steps=400, master_lr=1e-3, speed_steps=10),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, scaling_steps=1000, shrink_exp=16,
                    growth_interval=50, master_steps=2000, master_lr=1e-3, speed_steps=20),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus() -> data.Corpus:
    return data.text()


def build(S: Settings) -> GPT:
    torch.manual_seed(S.seed)
    text = corpus()
    return GPT(GPTConfig(vocab_size=text.vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=4,
                         n_embd=S.n_embd)).to(pick_device())


# --- 1. the formats ---------------------------------------------------------------------------------------

COMMONLY_QUOTED = {  # the figures tables usually give: largest value and decimal digits
    "fp32": (3.4e38, 7), "bf16": (3.39e38, 3), "fp16": (65504.0, 3), "fp8_e4m3": (448.0, 1), "fp8_e5m2": (57344.0, 1),
}


def formats_table() -> go.Figure:
    rows = []
    for name, f in FORMATS.items():
        fi = torch.finfo(f.dtype) if f.dtype is not None else None
        agrees = "—" if fi is None else ("yes" if (f.max, f.min_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)
                                         else "NO")
        rows.append((name, f"1 / {f.exp_bits} / {f.mantissa_bits}", f"{f.max:.6g}", f"{f.min_normal:.3g}",
                     f"{f.min_subnormal:.3g}", f"{f.eps:.3g}", f"{f.decimal_digits:.1f}", agrees))
    return plots.table(["format", "sign / exp / mantissa bits", "largest", "smallest normal", "smallest subnormal",
                        "eps (gap after 1)", "decimal digits", "= torch.finfo"], rows,
                       title="Formats, computed from their bit widths")


def range_figure() -> go.Figure:
    """Each format's range on a log2 axis: subnormals (thin), normals (thick), and its eps."""
    fig = go.Figure()
    names = list(FORMATS)[::-1]
    for i, name in enumerate(names):
        f = FORMATS[name]
        lo, mid, hi = math.log2(f.min_subnormal), math.log2(f.min_normal), math.log2(f.max)
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=[lo, mid], y=[name, name], mode="lines", line=dict(color=c, width=4),
                                 showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[mid, hi], y=[name, name], mode="lines+text", line=dict(color=c, width=14),
                                 text=["", f"  max {f.max:.3g}, eps 2^{int(math.log2(f.eps))}"],
                                 textposition="middle right", showlegend=False, hoverinfo="skip"))
    fig.add_vline(x=0, line=dict(color="black", dash="dot"))
    plots.style(fig, "Range of each format (log₂ of magnitude; thin = subnormal)", "log₂ |x|", "")
    fig.update_xaxes(range=[-160, 200])
    return fig


def explorer_figure(x: float) -> go.Figure:
    rows = []
    for name in FORMATS:
        d = decompose(x, name)
        rows.append((name, d.bits, f"{d.stored:.10g}", d.category, f"{d.abs_error:.3g}", f"{d.rel_error:.3g}"))
    return plots.table(["format", "sign exponent mantissa", "stored value", "kind", "abs error", "rel error"], rows,
                       title=f"{x!r} in every format")


def explorer_panel() -> Panel:
    return Panel(explorer_figure, {"x": W.FloatText(value=0.1, description="x")}, debounce_ms=0,
                 title="Type a number")


# --- 2. overflow: the residual stream past 65504 ------------------------------------------------------------

OVERFLOW_SCALES = tuple(float(10**e) for e in np.arange(0, 7.01, 0.5))


def _forward_probe(model: nn.Module, X, Y, k: float, autocast_fp16: bool = False) -> dict:
    """Forward pass with the embedding output — the start of the residual stream — multiplied by k, in the
    model's own dtype (fp16/bf16 *storage*: every weight and activation cast) or, with autocast_fp16, with fp32
    weights under torch.autocast(float16) as mixed-precision training runs. Records each leaf module's largest
    |output| and the first one that is not finite."""
    acts, first = {}, []
    handles = [model.transformer.wte.register_forward_hook(lambda mod, i, o: o * k)]
    for name, mod in model.named_modules():
        if name and not list(mod.children()):
            def hook(mod, i, o, name=name):
                acts[name] = o.detach().float().abs().max().item()
                if not math.isfinite(acts[name]) and not first:
                    first.append(name)
            handles.append(mod.register_forward_hook(hook))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=autocast_fp16):
        _, loss = model(X, Y)
    for h in handles:
        h.remove()
    return {"loss": loss.item(), "first_nonfinite": first[0] if first else None, "acts": acts}


def overflow_sweep(S: Settings) -> dict[float, dict]:
    """For each residual-stream scale k: the model's activations and loss with weights stored in fp32, fp16 and
    bf16, and with fp32 weights under fp16 autocast ("fp16 autocast")."""
    base = build(S).cpu().eval()
    models = {"fp32": base, "fp16": copy.deepcopy(base).half(), "bf16": copy.deepcopy(base).bfloat16()}
    X, Y = corpus().batch("val", 4, S.block_size, torch.Generator().manual_seed(S.seed))
    out = {}
    for k in progress(OVERFLOW_SCALES, desc="overflow sweep"):
        out[k] = {name: _forward_probe(m, X, Y, k) for name, m in models.items()}
        out[k]["fp16 autocast"] = _forward_probe(base, X, Y, k, autocast_fp16=True)
    return out


AUTOCAST_SCALES = tuple(float(10**e) for e in np.arange(0, 5.01, 0.5))


def autocast_overflow_sweep(S: Settings) -> dict:
    """Where fp16 autocast does overflow: a matrix product whose output passes 65504. Block 0's first MLP weights
    are multiplied by k (LayerNorm in front of it cannot help), the model run under fp16 autocast."""
    model = build(S).cpu().eval()
    X, Y = corpus().batch("val", 4, S.block_size, torch.Generator().manual_seed(S.seed))
    w = model.transformer.h[0].mlp.c_fc.weight
    original = w.detach().clone()
    out = {"fp32_max": _forward_probe(model, X, Y, 1.0)["acts"]["transformer.h.0.mlp.c_fc"], "runs": {}}
    try:
        for k in AUTOCAST_SCALES:
            with torch.no_grad():
                w.copy_(original * k)
            out["runs"][k] = _forward_probe(model, X, Y, 1.0, autocast_fp16=True)
    finally:
        with torch.no_grad():
            w.copy_(original)
    return out


def overflow_threshold(sweep: dict[float, dict]) -> tuple[float, float | None]:
    """(predicted k, first k of the grid where fp16's loss is not finite). LayerNorm rescales every sub-layer's
    input, so only the residual stream grows with k; at large k it is dominated by k × the token embedding,
    which overflows when k · max|embedding| > 65504."""
    predicted = FORMATS["fp16"].max / sweep[1.0]["fp32"]["acts"]["transformer.wte"]
    return predicted, first_overflow({k: sweep[k]["fp16"] for k in OVERFLOW_SCALES})


def first_overflow(probes: dict[float, dict]) -> float | None:
    """The smallest k whose forward probe gave a non-finite loss (None: finite everywhere)."""
    return next((k for k in sorted(probes) if not math.isfinite(probes[k]["loss"])), None)


def overflow_figure(sweep: dict[float, dict], k: float) -> go.Figure:
    r = sweep[k]
    names = list(r["fp32"]["acts"])
    fig = go.Figure(go.Bar(x=names, y=[r["fp32"]["acts"][n] for n in names], name="largest |activation| (fp32)",
                           marker_color=plots.color(0)))
    fig.add_hline(y=FORMATS["fp16"].max, line=dict(color="red", dash="dash"), annotation_text="fp16 max 65504")
    def verdict_of(p):
        first = r[p]["first_nonfinite"]
        return f"{p}: loss {r[p]['loss']:.4g}" + (f" (first non-finite: {first})" if first else "")

    verdict = " · ".join(verdict_of(p) for p in ("fp16", "bf16", "fp16 autocast"))
    plots.style(fig, f"Residual stream × {k:.3g} — {verdict}", "", "largest |value|")
    fig.update_yaxes(type="log")
    fig.update_xaxes(tickangle=45)
    return fig


def overflow_panel(sweep: dict[float, dict]) -> Panel:
    control = W.SelectionSlider(options=[(f"{k:.0e}", k) for k in OVERFLOW_SCALES], value=1e6,
                                description="scale k", style={"description_width": "initial"})  # 1e6: fp16 fails
    return Panel(lambda k: overflow_figure(sweep, k), {"k": control}, debounce_ms=0,
                 title="Scale the residual stream: where does fp16 give up?")


# --- 3. underflow: real gradients against fp16's smallest numbers -----------------------------------------------

def real_gradients(S: Settings, steps: int = 100) -> np.ndarray:
    """|g| of every parameter after `steps` of training (fp32), from one fresh batch."""
    model = build(S)
    text = corpus()
    train(model, text, TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=3e-3,
                                   seed=S.seed, desc="train a little"))
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(S.seed + 1), pick_device())
    model.zero_grad()
    model(X, Y)[1].backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).abs().double().cpu().numpy()


def fp16_fractions(g: np.ndarray, log2_scale: float = 0.0) -> dict:
    """What fp16 does to g·S: fractions flushed to zero, subnormal (reduced precision), overflowed to inf."""
    stored = torch.from_numpy(g * 2.0**log2_scale).to(torch.float16).double().numpy()
    nonzero = g > 0
    return {"flushed": float(np.mean((stored == 0) & nonzero)),
            "subnormal": float(np.mean((stored != 0) & (np.abs(stored) < FORMATS["fp16"].min_normal))),
            "overflow": float(np.mean(np.isinf(stored)))}


def underflow_figure(g: np.ndarray, log2_scale: float) -> go.Figure:
    lg = np.log2(g[g > 0]) + log2_scale
    fr = fp16_fractions(g, log2_scale)
    fig = go.Figure(go.Histogram(x=lg, nbinsx=120, marker_color=plots.color(0), name="gradients"))
    f = FORMATS["fp16"]
    for x, label, color in ((math.log2(f.min_subnormal), "smallest subnormal 2⁻²⁴", "red"),
                            (math.log2(f.min_normal), "smallest normal 2⁻¹⁴", "orange"),
                            (math.log2(f.max), "max 65504", "red")):
        fig.add_vline(x=x, line=dict(color=color, dash="dash"), annotation_text=label, annotation_position="top")
    plots.style(fig, f"log₂|g·S| with S = 2^{log2_scale:g}: {fr['flushed']:.2%} flushed to zero, "
                       f"{fr['subnormal']:.1%} subnormal, {fr['overflow']:.2%} overflow", "log₂ |g · S|", "count")
    fig.update_xaxes(range=[-50, 20])
    return fig


def underflow_panel(g: np.ndarray) -> Panel:
    return Panel(lambda log2_scale: underflow_figure(g, log2_scale),
                 {"log2_scale": slider(0, 0, 32, 1, description="log₂ S")}, debounce_ms=0,
                 title="Multiply the gradients by S before storing them in fp16")


# --- 4. loss scaling in a real run --------------------------------------------------------------------------------

class _ShrinkGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by c on the way back."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.c = c
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c, None


class SmallGradients(nn.Module):
    """The GPT with every gradient below its logits multiplied by c: a large model's gradient scale on a tiny
    model. The loss value is unchanged; in fp32 (and with Adam, which divides out a gradient's scale) so is
    training. Only a format with fp16's narrow range notices."""

    def __init__(self, model: GPT, c: float):
        super().__init__()
        self.model, self.c, self.config = model, c, model.config

    def forward(self, idx, targets=None):
        logits, _ = self.model(idx)
        logits = _ShrinkGrad.apply(logits, self.c)
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


PARTIAL_EXP = 12  # a shrink at which only part of this model's gradients fall below fp16's range
SHORT_RUN = 20   # steps of the runs whose outcome is decided at the first step


def _zero_grad_probe(info: StepInfo):
    """Fraction of gradient entries that are exactly zero after the step's backward (flushed, or never reached)."""
    zero = n = 0
    for p in info.model.parameters():
        if p.grad is not None:
            zero += int((p.grad == 0).sum())
            n += p.grad.numel()
    info.log["zero_grads"] = zero / n


def scaling_runs(S: Settings) -> dict[str, History]:
    k = S.shrink_exp
    configs = {
        "fp32": ("fp32", None, k),
        "bf16": ("bf16", None, k),
        "bf16 + GradScaler": ("bf16", torch.amp.GradScaler(pick_device().type, init_scale=2.0**16,
                                                           growth_interval=S.growth_interval), k),
        "fp16, no scaler": ("fp16", DynamicLossScaler(enabled=False), k),
        f"fp16, no scaler, gradients at 2^-{PARTIAL_EXP}": ("fp16", DynamicLossScaler(enabled=False), PARTIAL_EXP),
        f"fp16, static 2^{k}": ("fp16", DynamicLossScaler(2.0**k, growth_factor=1.0, backoff_factor=1.0), k),
        f"fp16, static 2^{k + 24}": ("fp16", DynamicLossScaler(2.0 ** (k + 24), growth_factor=1.0,
                                                               backoff_factor=1.0), k),
        "fp16, dynamic": ("fp16", DynamicLossScaler(2.0**16, growth_interval=S.growth_interval), k),
    }
    # Runs whose outcome is fixed from the first step (every gradient flushed, every step skipped, every bit the
    # same as bf16's) show it in SHORT_RUN steps; the claims read only the first and last validation estimates,
    # so five estimates per run draw the curves (each costs ten forward passes; emulated on CPUs without fp16).
    short = {"bf16 + GradScaler", "fp16, no scaler", f"fp16, static 2^{k + 24}"}
    out = {}
    for name, (precision, scaler, shrink) in configs.items():
        model = SmallGradients(build(S), 2.0**-shrink)
        steps = min(S.scaling_steps, SHORT_RUN) if name in short else S.scaling_steps
        cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=3e-3,
                          precision=precision, eval_every=max(1, steps // 5), seed=S.seed, desc=name)
        out[name] = train(model, corpus(), cfg, scaler=scaler, callback=_zero_grad_probe)
    return out


def scaling_figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation loss", "dynamic scaler: scale and skipped steps"))
    for i, (name, h) in enumerate(runs.items()):
        fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=name,
                                 line=dict(color=plots.color(i)), marker=dict(size=4)), row=1, col=1)
    h = runs["fp16, dynamic"]
    fig.add_trace(go.Scatter(x=h.step, y=h.loss_scale, mode="lines", name="scale S", line=dict(color="black")),
                  row=1, col=2)
    skipped = [s for s, k in zip(h.step, h.skipped) if k]
    fig.add_trace(go.Scatter(x=skipped, y=[h.loss_scale[s - h.step[0]] for s in skipped], mode="markers",
                             name="skipped step", marker=dict(color="red", symbol="x", size=9)), row=1, col=2)
    fig.update_yaxes(type="log", title_text="S", row=1, col=2)
    fig.update_xaxes(title_text="step")
    plots.style(fig, height=420)
    return fig


# --- 5. why fp32 master weights ---------------------------------------------------------------------------------

def _unchanged_probe():
    """Log the fraction of weights a step left exactly unchanged (all, and LayerNorm gains)."""
    snap = {}

    def probe(info: StepInfo):
        same = n = 0
        ln = []
        for name, p in info.model.named_parameters():
            prev = snap.get(name)
            if prev is not None:
                eq = p.detach() == prev
                same += eq.sum().item()
                n += eq.numel()
                if "ln_" in name and name.endswith("weight"):
                    ln.append(eq.float().mean().item())
            snap[name] = p.detach().clone()
        info.log["unchanged"] = same / n if n else 0.0
        info.log["ln_unchanged"] = float(np.mean(ln)) if ln else 0.0

    return probe


def master_runs(S: Settings) -> dict[str, History]:
    """Same run twice: fp32 weights with bf16 autocast (mixed precision), and weights stored in bf16 (pure)."""
    out = {}
    for name in ("fp32 master + bf16 compute", "pure bf16 weights"):
        model = build(S)
        if name.startswith("pure"):
            model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=S.master_lr, betas=(0.9, 0.95), weight_decay=0.1)
        cfg = TrainConfig(steps=S.master_steps, batch_size=S.batch_size, block_size=S.block_size, lr=S.master_lr,
                          precision="bf16" if name.startswith("fp32") else "fp32",
                          lr_schedule=bind(warmup_cosine, warmup=S.master_steps // 10, total=S.master_steps,
                                           min_ratio=0.1), eval_every=max(1, S.master_steps // 5), seed=S.seed,
                          desc=name)
        out[name] = train(model, corpus(), cfg, optimizer=opt, callback=_unchanged_probe())
    return out


def master_stats(runs: dict[str, History]) -> dict:
    out = {}
    for name, h in runs.items():
        u, ln = np.array(h.extra["unchanged"]), np.array(h.extra["ln_unchanged"])
        late = slice(len(u) * 3 // 4, None)
        out[name] = {"unchanged_late": float(u[late].mean()), "ln_unchanged_late": float(ln[late].mean()),
                     "final_val": h.final_val_loss}
    return out


def master_figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation loss", "fraction of weights a step left unchanged"))
    for i, (name, h) in enumerate(runs.items()):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=name, line=dict(color=c),
                                 legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=h.step, y=h.extra["unchanged"], mode="lines", line=dict(color=c), showlegend=False,
                                 legendgroup=name), row=1, col=2)
        fig.add_trace(go.Scatter(x=h.step, y=h.extra["ln_unchanged"], mode="lines", line=dict(color=c, dash="dot"),
                                 name=f"{name}: LayerNorm gains", legendgroup=name), row=1, col=2)
    fig.update_xaxes(title_text="step")
    plots.style(fig, height=420)
    return fig


# --- 6. speed ------------------------------------------------------------------------------------------------------

def cpu_flags() -> list[str]:
    """The CPU's native low-precision features (Linux): what decides whether fp16/bf16 math is fast here."""
    cpuinfo = Path("/proc/cpuinfo")
    if platform.system() != "Linux" or not cpuinfo.exists():
        return []
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("flags")), [])
    return sorted(f for f in flags if f in {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile",
                                            "avx_vnni", "f16c"})


def speed(S: Settings) -> dict[str, dict[str, float]]:
    """Median ms per training step (forward, backward, AdamW) under each autocast precision, and per n×n
    (S.matmul_size) matrix product in each dtype: the step shows the overheads, the product the arithmetic units.
    The precisions take turns, round after round, so a slow moment of the machine hits all three alike."""
    text = corpus()
    dev = pick_device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(0), dev)
    precisions = ("fp32", "bf16", "fp16")
    models = {p: build(S) for p in precisions}
    opts = {p: torch.optim.AdamW(models[p].parameters(), lr=1e-4) for p in precisions}
    mats = {p: torch.randn(S.matmul_size, S.matmul_size, device=dev).to(FORMATS[p].dtype) for p in precisions}
    step = {p: [] for p in precisions}
    matmul = {p: [] for p in precisions}
    for i in progress(range(S.speed_steps + 1), desc="timing (rounds)"):
        for p in precisions:
            sync()
            t0 = time.perf_counter()
            with autocast(dev, p):
                _, loss = models[p](X, Y)
            loss.backward()
            opts[p].step()
            opts[p].zero_grad(set_to_none=True)
            sync()
            t1 = time.perf_counter()
            mats[p] @ mats[p]
            sync()
            if i:  # the first round warms up
                step[p].append((t1 - t0) * 1e3)
                matmul[p].append((time.perf_counter() - t1) * 1e3)
    return {"step": {p: float(np.median(v)) for p, v in step.items()},
            "matmul": {p: float(np.median(v)) for p, v in matmul.items()}, "matmul_size": S.matmul_size,
            "device": dev.type}


# --- words and claims ------------------------------------------------------------------------------------------------

def formats_findings(ledger: Ledger) -> str:
    for name, f in FORMATS.items():
        if f.dtype is not None:
            fi = torch.finfo(f.dtype)
            ledger.add(f"finfo_{name}", f"{name}: largest, smallest normal and eps from the bit widths equal "
                       "torch.finfo", (f.max, f.min_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps), is_true(),
                       kind="computed")
    for name, (largest, digits) in COMMONLY_QUOTED.items():
        ledger.add(f"quoted_{name}", f"{name}: the commonly quoted largest value {largest:g} (±1%)", FORMATS[name].max,
                   approx(largest, rel=0.01), source="common tables", kind="computed")
    one = decompose(1 + 2**-9, "bf16").stored
    ledger.add("bf16_one", "1 + 2⁻⁹ is stored as exactly 1 in bf16", one == 1.0, is_true(), kind="measured")
    return f"Computed from the bit widths and checked against torch.finfo; 1 + 2⁻⁹ in bf16 is stored as {one:g}."


def overflow_findings(ledger: Ledger, sweep: dict[float, dict]) -> str:
    predicted, observed = overflow_threshold(sweep)
    bf16_ok = all(math.isfinite(r["bf16"]["loss"]) for r in sweep.values())
    first = next((sweep[k]["fp16"]["first_nonfinite"] for k in OVERFLOW_SCALES if sweep[k]["fp16"]["first_nonfinite"]),
                 None)
    ledger.add("fp16_overflow", "Residual stream scaled past 65504: fp16's loss is not finite at the largest k",
               not math.isfinite(sweep[OVERFLOW_SCALES[-1]]["fp16"]["loss"]), is_true(), kind="measured")
    ledger.add("fp16_fine_small", "… and is finite (equal to fp32's within 1%) at k = 1",
               abs(sweep[1.0]["fp16"]["loss"] / sweep[1.0]["fp32"]["loss"] - 1), at_most(0.01), kind="measured")
    ledger.add("bf16_no_overflow", "bf16's loss stays finite at every k", bf16_ok, is_true(), kind="measured")
    ledger.add("overflow_where_predicted", "fp16 fails where 65504 ÷ max|embedding| predicts (first failing k on the "
               "grid ÷ predicted: within one grid step, a factor √10, above)", (observed or math.inf) / predicted,
               between(1.0, math.sqrt(10)), kind="measured")
    auto_ok = all(math.isfinite(r["fp16 autocast"]["loss"]) for r in sweep.values())
    ledger.add("autocast_no_overflow", "Under fp16 *autocast* (fp32 weights, as section 4 trains) the same scaled "
               "residual stream never overflows: the loss is finite at every k (the residual add stays fp32, "
               "LayerNorm runs in fp32)", auto_ok, is_true(), kind="measured")
    ledger.note("overflow_threshold", {"predicted": predicted, "observed": observed})
    return (f"The largest token-embedding value is {sweep[1.0]['fp32']['acts']['transformer.wte']:.3g}, so fp16 should "
            f"give up near k ≈ {predicted:.3g}; on the grid, fp16's loss is first non-finite at k = "
            f"{observed:.3g}{f', starting in `{first}`' if first else ''}. bf16 stayed finite at every k "
            f"({'yes' if bf16_ok else 'no'}): its exponent is fp32's, so its largest number is 3.4 × 10³⁸, not "
            "65504.\n\n"
            "This demo casts the *whole model* to fp16 (fp16 storage). Mixed-precision training does not: under "
            "`torch.autocast` the weights stay fp32, LayerNorm and the residual additions run in fp32, and only the "
            "matrix products are done in fp16 — on inputs LayerNorm has just normalised. So the same scaled stream "
            f"{'never' if auto_ok else 'did'} overflow{'ed' if not auto_ok else 's'} under fp16 autocast, even at "
            f"k = {OVERFLOW_SCALES[-1]:.0e} (measured). Where autocast does overflow is shown next.")


def autocast_findings(ledger: Ledger, r: dict) -> str:
    predicted = FORMATS["fp16"].max / r["fp32_max"]
    observed = first_overflow(r["runs"])
    where = next((run["first_nonfinite"] for run in r["runs"].values() if run["first_nonfinite"]), None)
    ledger.add("autocast_overflow", "fp16 autocast overflows where a matrix product's output passes 65504: block 0's "
               "MLP weights × k fail at the k that 65504 ÷ its largest output predicts (first failing k on the grid ÷ "
               "predicted: within one grid step, above)", (observed or math.inf) / predicted,
               between(1.0, math.sqrt(10)), kind="measured")
    ledger.note("autocast_overflow", {"predicted": predicted, "observed": observed, "first_nonfinite": where})
    return (f"Block 0's first MLP product has largest output {r['fp32_max']:.3g} (fp32), so with its weights × k "
            f"fp16 autocast should fail near k ≈ {predicted:.3g}; it first failed at k = {observed:.3g}"
            + (f", in `{where}`" if where else "") + ". Under autocast the danger is not the residual stream but "
            "a product whose *output* leaves fp16's range: large weights, or attention logits q·kᵀ growing during "
            "training — the reason bf16 (or fp32 attention logits) is preferred for large models.")


def underflow_findings(ledger: Ledger, grads: np.ndarray) -> str:
    fr0, fr16 = fp16_fractions(grads, 0), fp16_fractions(grads, 16)
    ledger.add("underflow", "Some real gradients flush to zero in fp16 (fraction of parameters' gradient entries)",
               fr0["flushed"], at_least(1e-4), kind="measured")
    ledger.add("underflow_recovered", "A scale of 2¹⁶ recovers them (flushed with S = 2¹⁶ ÷ without)",
               fr16["flushed"] / max(fr0["flushed"], 1e-12), at_most(0.2), kind="measured")
    ledger.note("fp16_fractions", {"S=1": fr0, "S=2^16": fr16})
    return (f"Of this model's real gradient entries, {fr0['flushed']:.2%} flush to zero in fp16 and "
            f"{fr0['subnormal']:.1%} are subnormal; scaled by 2¹⁶, {fr16['flushed']:.2%} flush.")


def scaling_findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> str:
    k = S.shrink_exp
    f = {n: h.final_val_loss for n, h in runs.items()}
    dyn, none, fp32 = runs["fp16, dynamic"], runs["fp16, no scaler"], runs["fp32"]
    high = runs[f"fp16, static 2^{k + 24}"]
    ledger.add("no_scaler_stalls", f"Gradients at 2⁻{k}: fp16 without a scaler learns nothing (val loss drop over "
               f"its {len(none.loss)} steps)", none.val_loss[0] - none.final_val_loss, at_most(0.05), kind="measured")
    ledger.add("fp32_learns", f"… while fp32 learns (val loss drop over its {len(fp32.loss)} steps)",
               fp32.val_loss[0] - fp32.final_val_loss,
               at_least(0.5), kind="measured")
    ledger.add("static_right", f"A static scale of 2^{k} trains like fp32 (|Δ final val| ≤ 0.1; fp16 rounding "
               "drifts the runs apart by a few hundredths, while a scale that fails loses the whole drop above)",
               abs(f[f"fp16, static 2^{k}"] - f["fp32"]), at_most(0.1), kind="measured")
    ledger.add("static_too_high", f"A static scale of 2^{k + 24} overflows: every step skipped (fraction)",
               float(np.mean(high.skipped)), approx(1.0, abs=1e-9), kind="measured")
    ledger.add("dynamic_backs_off", "The dynamic scaler both grows and backs off (skipped steps)", sum(dyn.skipped),
               at_least(1), kind="measured")
    ledger.add("dynamic_matches", "… and trains close to fp32; the steps it skips cost a little (|Δ final val| ≤ 0.1)",
               abs(f["fp16, dynamic"] - f["fp32"]), at_most(0.1), kind="measured")
    partial_name = f"fp16, no scaler, gradients at 2^-{PARTIAL_EXP}"
    flushed = {n: float(np.mean(h.extra["zero_grads"])) for n, h in runs.items()}
    drop = {n: h.val_loss[0] - h.final_val_loss for n, h in runs.items()}
    ledger.add("partial_underflow", f"At 2^-{PARTIAL_EXP} underflow is partial: fp16 without a scaler flushes some of "
               "the gradient entries to zero, not all (fraction exactly zero, mean over steps)",
               flushed[partial_name], between(0.01, 0.99),
               kind="measured")
    ledger.add("partial_costs", "… and that run ends clearly worse than fp32 (final val loss − fp32's): partial "
               "underflow is not harmless", f[partial_name] - f["fp32"], at_least(0.1), kind="measured")
    bf, bs = runs["bf16"], runs["bf16 + GradScaler"]
    ledger.add("bf16_scaler_same", "bf16 autocast with a GradScaler: every training loss (its first "
               f"{len(bs.loss)} steps) equals the run without one "
               "(max |Δ loss|; a power-of-two scale is exact in bf16, and nothing underflows)",
               max(abs(a - b) for a, b in zip(bf.loss, bs.loss)), at_most(0.0), kind="measured")
    ledger.add("bf16_scaler_grows", "… it never skips a step, so its scale only grows (skipped steps)",
               sum(bs.skipped), at_most(0), kind="measured")
    ledger.note("scaling_final_val", f)
    ledger.note("zero_grad_fraction", flushed)
    finals = ", ".join(f"{n} {v:.3f}" + (f" ({len(runs[n].loss)} steps)" if len(runs[n].loss) < S.scaling_steps
                                           else "") for n, v in f.items())
    return (f"Final val loss: {finals}. Without a scaler every fp16 gradient "
            f"was flushed to zero ({flushed['fp16, no scaler']:.1%} of the entries exactly zero, measured) and nothing "
            f"was learned. A static 2^{k} undoes the 2^-{k} exactly; a static 2^{k + 24} overflowed on "
            f"{sum(high.skipped)} of its {len(high.skipped)} steps, all skipped. The dynamic scaler started at 2^16, "
            f"grew every {S.growth_interval} clean steps, backed off {sum(dyn.skipped)} times, and ended at "
            f"2^{math.log2(dyn.loss_scale[-1]):.0f}.\n\n"
            f"Those two extremes are **manufactured**: 2^-{k} puts every one of this model's gradients below fp16's "
            f"flush-to-zero threshold, and 2^{k + 24} puts them above 65504, so 'learns nothing' and 'skips every "
            "step' follow from the chosen shrink — they show the mechanism, not what a real run looks like. A real "
            f"model's gradients span many orders of magnitude, so underflow is partial. At 2^-{PARTIAL_EXP}, "
            f"{flushed[partial_name]:.1%} of the gradient entries were zero (fp32 run: {flushed['fp32']:.1%}) and "
            f"the run's val loss moved by {-drop[partial_name]:+.2f} nats against fp32's {-drop['fp32']:+.2f}: "
            + ("it still learned, only worse — nothing announces the lost gradients but a worse loss."
               if drop[partial_name] > 0 else
               "it ended above where it started — a run that loses most of its gradients to underflow need not "
               "stall politely, it can get worse.")
            + "\n\n"
            "**GradScaler with bf16** (some recipes keep it): the bf16 run with `torch.amp.GradScaler` took every "
            f"step ({sum(bs.skipped)} skipped), its scale grew to 2^{math.log2(bs.loss_scale[-1]):.0f}, and its "
            "losses differ from the plain bf16 run's by at most "
            f"{max(abs(a - b) for a, b in zip(bf.loss, bs.loss)):.1g} (measured). bf16 has fp32's exponent, so no "
            "gradient underflows and a power-of-two scale changes no bit: the scaler only costs a multiply, an "
            "unscale and an inf check per step. It is unnecessary.")


def master_findings(ledger: Ledger, runs: dict[str, History]) -> str:
    st = master_stats(runs)
    a, b = st["fp32 master + bf16 compute"], st["pure bf16 weights"]
    ledger.add("bf16_stagnates", "Pure bf16 weights: late in training a step leaves most weights unchanged "
               "(fraction unchanged)", b["unchanged_late"], at_least(0.3), kind="measured")
    ledger.add("ln_frozen", "… and the LayerNorm gains frozen (fraction unchanged)", b["ln_unchanged_late"],
               at_least(0.9), kind="measured")
    ledger.add("master_moves", "With fp32 master weights, almost every weight moves (fraction unchanged)",
               a["unchanged_late"], at_most(0.01), kind="measured")
    ledger.note("master", st)
    return (f"In the last quarter of training, a step left {b['unchanged_late']:.0%} of the pure-bf16 weights exactly "
            f"unchanged (LayerNorm gains: {b['ln_unchanged_late']:.0%}), against {a['unchanged_late']:.1%} with an "
            f"fp32 master copy. Final val loss: {b['final_val']:.3f} pure bf16, {a['final_val']:.3f} with the master. "
            "A bf16 weight near 1.0 can only move in steps of 2⁻⁷; an Adam update of lr × (a fraction) at lr "
            f"{runs['pure bf16 weights'].lr[-1]:.1e} rounds back to where it was.")


def speed_findings(ledger: Ledger, ms: dict[str, dict[str, float]]) -> str:
    st, mm, n = ms["step"], ms["matmul"], ms["matmul_size"]
    flags = cpu_flags()
    native_bf16 = any(f in flags for f in ("avx512_bf16", "amx_bf16"))
    speedup = st["fp32"] / st["bf16"]
    ledger.note("ms_per_step", ms)
    ledger.note("cpu_flags", flags)
    if ms.get("device") == "cpu" and not native_bf16:
        ledger.add("no_doubling_here", "\"Mixed precision doubles throughput\" is a fact of hardware with 16-bit "
                   "units: on this CPU (no avx512_bf16/amx_bf16) bf16 autocast does not speed training up at all "
                   "(steps per second, bf16 ÷ fp32, medians of alternating rounds)", speedup, at_most(1.0),
                   source="a source article", kind="measured")
    else:
        ledger.note("bf16_speedup", speedup)
    slow = {p: mm[p] / mm["fp32"] for p in ("bf16", "fp16")}
    emulated = [p for p in ("bf16", "fp16") if slow[p] > 4]
    return (f"Per training step of this lesson's small model: fp32 {st['fp32']:.1f} ms, bf16 {st['bf16']:.1f} ms, fp16 "
            f"{st['fp16']:.1f} ms — bf16 autocast runs at {speedup:.2f}× fp32's speed here (the articles' "
            "\"mixed precision doubles throughput\" is measured on GPUs' tensor cores). "
            f"Per {n}×{n} matrix product: fp32 {mm['fp32']:.2f} ms, bf16 {mm['bf16']:.2f} ms "
            f"({slow['bf16']:.3g}× fp32's time), fp16 {mm['fp16']:.2f} ms ({slow['fp16']:.3g}×). "
            + (f"This CPU reports {', '.join(flags)}. " if flags else "This CPU reports no 16-bit arithmetic flags. ")
            + (f"{' and '.join(emulated)} products took over 4× fp32's time: without native units the CPU converts "
               "and computes them in software, which is why the 16-bit runs here are kept tiny. " if emulated else
               "No 16-bit product was much slower than fp32: this machine has units for them. ")
            + "At small sizes the casts autocast inserts can cost more than the narrower products save; at large "
            "sizes the products dominate. On a GPU, bf16 and fp16 both run on tensor cores.")
