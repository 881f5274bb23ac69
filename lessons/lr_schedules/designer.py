"""Lesson 02, section 1: the schedule designer — every schedule's multiplier per step, and a panel."""

import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.controls import choice_slider, slider
from labtools.schedules import SHAPES, bind, linear_warmup, warmup_cosine, warmup_linear, wsd
from labtools.widgets import Panel


def schedule_set(total: int, warmup_frac: float, min_ratio: float, stable_frac: float, shape: str) -> dict:
    """The four schedules of this lesson over `total` steps, with shared warmup and floor."""
    warmup = int(round(warmup_frac * total))
    stable = int(round(stable_frac * (total - warmup)))
    decay = max(1, total - warmup - stable)
    return {
        "constant (after warmup)": bind(linear_warmup, warmup=warmup),
        "cosine": bind(warmup_cosine, warmup=warmup, total=total, min_ratio=min_ratio),
        "linear": bind(warmup_linear, warmup=warmup, total=total, min_ratio=min_ratio),
        f"WSD ({shape} decay)": bind(wsd, warmup=warmup, stable=stable, decay=decay, min_ratio=min_ratio, shape=shape),
    }


def figure(total: int, warmup_frac: float, peak_lr: float, min_ratio: float, stable_frac: float,
                    shape: str) -> go.Figure:
    steps = np.unique(np.linspace(0, total, min(total + 1, 500)).round().astype(int))  # ≤ 500 points draw it exactly
    curves = {name: [peak_lr * f(int(s)) for s in steps]
              for name, f in schedule_set(total, warmup_frac, min_ratio, stable_frac, shape).items()}
    fig = plots.lines(steps, curves, title="Learning rate over training", xaxis="step", yaxis="learning rate")
    fig.update_yaxes(range=[0, peak_lr * 1.05])
    return fig


def panel(total: int = 1000) -> Panel:
    import ipywidgets as W
    controls = {
        "total": slider(total, 100, 5000, 100, description="total steps"),
        "warmup_frac": slider(0.05, 0.0, 0.3, 0.01, description="warmup fraction"),
        "peak_lr": choice_slider(3e-3, 1e-5, 1e-1, "peak lr", include=(6e-4,)),
        "min_ratio": slider(0.1, 0.0, 1.0, 0.05, description="min ratio"),
        "stable_frac": slider(0.8, 0.0, 0.95, 0.05, description="WSD stable fraction"),
        "shape": W.Dropdown(options=list(SHAPES), value="cosine", description="WSD decay"),
    }
    return Panel(figure, controls, debounce_ms=0, title="Schedule designer")
