"""Lesson 04, section 3: underflow — how much of a real gradient fp16 flushes to zero or subnormals."""

import math

import numpy as np
import plotly.graph_objects as go
import torch

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.controls import slider
from labtools.device import pick_device
from labtools.precision import FORMATS
from labtools.train import TrainConfig, train
from labtools.widgets import Panel
from lessons.mixed_precision import Settings, build, corpus


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


def figure(g: np.ndarray, log2_scale: float) -> go.Figure:
    lg = np.log2(g[g > 0]) + log2_scale
    fr = fp16_fractions(g, log2_scale)
    fig = go.Figure(go.Histogram(x=lg, nbinsx=120, marker_color=plots.color(0), name="gradients"))
    f = FORMATS["fp16"]
    for x, label, color in ((math.log2(f.min_subnormal), "smallest subnormal 2⁻²⁴", "red"),
                            (math.log2(f.min_normal), "smallest normal 2⁻¹⁴", "orange"),
                            (math.log2(f.max), "max 65504", "red")):
        fig.add_vline(x=x, line=dict(color=color, dash="dash"), annotation_text=label, annotation_position="top")
    over = f", {fr['overflow']:.2%} overflow" if fr["overflow"] else ""
    lost = (f"{fr['flushed']:.2%} flush to zero in fp16{over}" if fr["flushed"] or fr["overflow"]
            else "none flush to zero or overflow in fp16")
    plots.style(fig, f"Gradients × κ = 2^{log2_scale:g}: {lost}", "log₂ |g · κ|", "count")
    fig.update_xaxes(range=[-50, 20])
    return fig


def panel(g: np.ndarray) -> Panel:
    return Panel(lambda log2_scale: figure(g, log2_scale),
                 {"log2_scale": slider(0, 0, 32, 1, description="log₂ S")}, debounce_ms=0,
                 title="Multiply the gradients by κ before storing them in fp16")


def findings(ledger: Ledger, grads: np.ndarray) -> Findings:
    fr0, fr16 = fp16_fractions(grads, 0), fp16_fractions(grads, 16)
    ledger.add("underflow", "Some real gradients flush to zero in fp16 (fraction of parameters' gradient entries)",
               fr0["flushed"], at_least(1e-4), kind="measured")
    ledger.add("underflow_recovered", "Multiplied by κ = 2¹⁶ before fp16 stores them, most of those gradients "
               "survive (flushed with κ = 2¹⁶ ÷ without)",
               fr16["flushed"] / max(fr0["flushed"], 1e-12), at_most(0.2), kind="measured", detail=True)
    ledger.note("fp16_fractions", {"S=1": fr0, "S=2^16": fr16})
    return Findings([
        f"Some of this model's real gradients flush to zero in fp16 (**{fr0['flushed']:.2%}**), and "
        f"{fr0['subnormal']:.0%} lose precision as subnormals.",
        "Multiplied by $\\kappa = 2^{16}$ before storing, "
        + (f"only {100 * fr16['flushed']:.2g}% flush" if fr16["flushed"] > 0 else "none flush")
        + ": the histogram slides right, into fp16's range.",
    ], [f"Overflow at $\\kappa = 2^{{16}}$: {100 * fr16['overflow']:.2g}% of the entries."])
