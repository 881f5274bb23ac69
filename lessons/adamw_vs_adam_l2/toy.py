"""Lesson 01, section 1: the mechanism on a toy — how fast each optimizer decays weights of different noise."""

import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most
from lessons.adamw_vs_adam_l2 import OPTIMIZERS, Settings

TOY_SIGMAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


TOY_LR, TOY_WD = 1e-2, 1e-2


def run(opt_name: str, S: Settings, sigmas=TOY_SIGMAS, lr: float = TOY_LR, wd: float = TOY_WD,
        independent_decay: bool = False) -> np.ndarray:
    """Weights start at 1 and get pure-noise gradients N(0, σ²): no signal, only decay pulls them.

    Each noise draw is used twice, with opposite signs (antithetic pairs), so the random walk the
    noise causes cancels in the mean weight and what remains is the decay. Returns the mean weight
    per noise level after each step, shape (steps + 1, len(sigmas)).
    """
    g = torch.Generator().manual_seed(S.seed)
    half = S.toy_n // 2
    params = [torch.ones(2 * half, requires_grad=True) for _ in sigmas]
    extra = dict(independent_decay=True) if independent_decay else {}
    opt = OPTIMIZERS[opt_name](params, lr=lr, betas=(0.9, 0.999), weight_decay=wd, **extra)
    means = np.ones((S.toy_steps + 1, len(sigmas)))
    for t in range(S.toy_steps):
        for p, s in zip(params, sigmas):
            noise = torch.randn(half, generator=g) * s
            p.grad = torch.cat([noise, -noise])
        opt.step()
        means[t + 1] = [p.mean().item() for p in params]
    return means


def decoupling_toy(S: Settings, factor: float = 4.0) -> dict[str, dict[float, float]]:
    """Decay per step of the toy's noisiest weights at lr and factor × lr: torch's AdamW (decay lr·λ) against
    Loshchilov & Hutter's form (decay f_t·λ, with f_t the schedule's multiplier; λ' = lr·λ so both agree at the
    lesson's lr): {form: {lr: decay}}."""
    out = {"torch": {}, "L&H": {}}
    for form, wd, independent in (("torch", TOY_WD, False), ("L&H", TOY_LR * TOY_WD, True)):
        for lr in (TOY_LR, factor * TOY_LR):
            means = run("AdamW", S, sigmas=(1.0,), lr=lr, wd=wd, independent_decay=independent)
            out[form][lr] = float(effective_decay(means)[0])
    return out


def effective_decay(means: np.ndarray) -> np.ndarray:
    """Per-step decay rate d of each column, from a log-linear fit while the mean is above 0.5."""
    rates = []
    for y in means.T:
        below = np.nonzero(y < 0.5)[0]
        k = max(int(below[0]) if below.size else len(y), 10)
        slope = np.polyfit(np.arange(k), np.log(np.clip(y[:k], 1e-12, None)), 1)[0]
        rates.append(-slope)
    return np.array(rates)


def predicted_l2_decay(sigma: float, lr: float = TOY_LR, wd: float = TOY_WD, theta: float = 1.0) -> float:
    """Adam + L2 at θ ≈ 1: the decay term λθ is divided by √v̂ ≈ √(σ² + (λθ)²); at most lr/θ per step."""
    return min(lr * wd / math.sqrt(sigma**2 + (wd * theta) ** 2), lr / theta)


def figure(means: dict[str, np.ndarray], rates: dict[str, np.ndarray], sigmas=TOY_SIGMAS) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Adam + L2: mean weight", "AdamW: mean weight",
                                                        "effective decay per step vs gradient noise"))
    for col, name in ((1, "AdamL2"), (2, "AdamW")):
        for j, s in enumerate(sigmas):
            fig.add_trace(go.Scatter(y=means[name][:, j], mode="lines", name=f"σ = {s:g}", legendgroup=f"s{j}",
                                     line=dict(color=plots.color(j)), showlegend=col == 1), row=1, col=col)
    for k, name in enumerate(("AdamL2", "AdamW")):
        fig.add_trace(go.Scatter(x=list(sigmas), y=rates[name], mode="markers+lines", name=f"{name} (measured)",
                                 marker=dict(size=9, symbol="circle" if k == 0 else "square"),
                                 line=dict(color="black" if k == 0 else "#1a7f37", dash="solid")), row=1, col=3)
    grid = np.logspace(math.log10(sigmas[0]), math.log10(sigmas[-1]), 60)
    fig.add_trace(go.Scatter(x=grid, y=[predicted_l2_decay(s) for s in grid], mode="lines",
                             name="Adam + L2 predicted: ηλ/√(σ²+λ²)", line=dict(color="gray", dash="dot")),
                  row=1, col=3)
    fig.add_trace(go.Scatter(x=[grid[0], grid[-1]], y=[TOY_LR * TOY_WD] * 2, mode="lines",
                             name="AdamW predicted: ηλ", line=dict(color="#1a7f37", dash="dot")), row=1, col=3)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_xaxes(type="log", title_text="gradient noise σ", row=1, col=3)
    fig.update_yaxes(type="log", title_text="decay per step", row=1, col=3)
    plots.style(fig, "The same λ in two forms: Adam + L2's decay depends on the gradient's spread, AdamW's "
                     "does not", height=420)
    return fig


def findings(ledger: Ledger, rates: dict[str, np.ndarray], means: dict[str, np.ndarray],
                 decoupling: dict[str, dict[float, float]], factor: float = 4.0) -> Findings:
    l2 = rates["AdamL2"]
    predicted = np.array([predicted_l2_decay(s) for s in TOY_SIGMAS])
    ledger.add("toy_l2_falls", "Toy: under Adam + L2 the effective decay falls as gradient noise grows "
               f"(decay at the smallest σ ÷ at the largest; predicted {predicted[0] / predicted[-1]:.0f})",
               l2[0] / l2[-1], at_least(30), source="Loshchilov & Hutter 2019", kind="measured")
    ledger.add("toy_l2_formula", "Toy: under Adam + L2 the decay per step follows η·λ/√(σ² + λ²θ²), capped at η/θ "
               "(worst ratio measured ÷ predicted over σ, as max(r, 1/r))",
               float(np.exp(np.abs(np.log(l2 / predicted)).max())), at_most(1.5), kind="measured")
    steps = means["AdamW"].shape[0] - 1
    exact = (1 - TOY_LR * TOY_WD) ** steps
    worst = float(np.abs(means["AdamW"][-1] / exact - 1).max())
    # one claim for "the same at every σ" and "exactly ηλ": a decay that varied with σ, as Adam + L2's does, would
    # leave the (1 − ηλ)^t curve by far more than fp32's rounding (2⁻²³ per step)
    ledger.add("toy_w_exact", "Toy: under AdamW every weight shrinks by the same factor, 1 − η·λ, per step whatever "
               "its gradient noise: the mean weight is (1 − η·λ)^t to float rounding (worst relative gap after the "
               "last step, over every σ)", worst, at_most(steps * 2.0**-23), kind="measured")
    torch_ratio = decoupling["torch"][factor * TOY_LR] / decoupling["torch"][TOY_LR]
    lh_ratio = decoupling["L&H"][factor * TOY_LR] / decoupling["L&H"][TOY_LR]
    ledger.add("torch_couples", f"torch's AdamW couples decay to the learning rate: ×{factor:g} η gives ×{factor:g} "
               "decay per step (ratio)", torch_ratio, approx(factor, rel=0.02), kind="measured")
    ledger.add("lh_decouples", f"Loshchilov & Hutter's form, whose decay is not multiplied by η, does not: ×{factor:g} "
               "η, the same decay (ratio)", lh_ratio, approx(1.0, rel=0.02),
               source="Loshchilov & Hutter 2019, claim (i)", kind="measured")
    ledger.note("toy_rates", {k: v.tolist() for k, v in rates.items()})
    ledger.note("decoupling", {form: {f"{lr:g}": d for lr, d in by_lr.items()} for form, by_lr in decoupling.items()})
    table = ("| gradient noise σ | Adam + L2: decay per step | predicted |\n|---|---|---|\n"
             + "\n".join(f"| {s:g} | {a:.3g} | {p:.3g} |" for s, a, p in zip(TOY_SIGMAS, l2, predicted)))
    return Findings([
        f"AdamW decays every weight by the same ηλ per step, whatever its gradient noise; Adam + L2 decayed the "
        f"quietest weights **{l2[0] / l2[-1]:.0f}×** as fast as the noisiest.",
        f"Quadrupling η quadrupled torch's AdamW decay (**{torch_ratio:.2f}×**); Loshchilov & Hutter's own form kept "
        f"it ({lh_ratio:.2f}×): see \"Decoupled from what?\".",
    ], [
        table,
        f"Under AdamW the decay per step was $\\eta\\lambda$ = {TOY_LR * TOY_WD:g} at every σ: the mean weight "
        "followed $(1-\\eta\\lambda)^t$ to float rounding.",
        "At the smallest σ the decay term is the whole gradient, so Adam normalises it to a step of about η: the "
        "weight falls by η per step, not by a fraction, which is why that point sits above the prediction.",
    ])
