"""Lesson 06, section 1: the anatomy of one training step's memory, measured. A small GPT with AdamW in fp32, what it
holds at each moment of a step (parameters, gradients, optimizer state, activations, temporaries), by torch's
MemTracker (labtools.memory.step_anatomy)."""

import plotly.graph_objects as go
import torch

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most
from labtools.memory import ANATOMY, ANATOMY_LABELS, MOMENTS, step_anatomy
from lessons.memory_budget import Settings
from lessons.memory_budget.validation import _model


def run(S: Settings) -> dict:
    """The largest of the validation shapes: its step's anatomy and its parameter count."""
    shape = max(S.validation_shapes, key=lambda s: s[0] * s[1] * s[1])
    model, X, Y = _model(shape, S.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return {"shape": shape, "n_params": sum(p.numel() for p in model.parameters()),
            "moments": step_anatomy(model, opt, X, Y)}


def figure(a: dict) -> go.Figure:
    fig = go.Figure()
    for i, kind in enumerate(ANATOMY):
        fig.add_trace(go.Bar(x=list(MOMENTS), y=[a["moments"][m][kind] / 2**20 for m in MOMENTS],
                             name=ANATOMY_LABELS[kind], marker_color=plots.color(i)))
    return plots.style(fig, "One AdamW step of a small GPT in fp32: what it holds at each moment", None, "MiB",
                       height=420, barmode="stack")


def findings(ledger: Ledger, a: dict) -> Findings:
    m, n = a["moments"], a["n_params"]
    states = m["after optimizer step"]
    per_param = (states["params"] + states["grads"] + states["optimizer"]) / n
    acts = m["after forward"]["activations"]
    ledger.add("sixteen_bytes", "fp32 AdamW holds 4 + 4 + 8 = 16 bytes per parameter after its step (parameters, "
               "gradients, Adam's two moments; PyTorch's memory tracker)", per_param, approx(16.0, rel=0.01),
               kind="measured")
    ledger.add("backward_frees", "Backward frees the activations it was kept for (after backward ÷ after forward)",
               m["after backward"]["activations"] / acts, at_most(0.01), kind="measured", detail=True)
    peak = m["peak"]
    share = peak["activations"] / sum(peak.values())
    return Findings([
        f"Into model states and activations. The model states are **{per_param:.0f}** bytes per parameter here: "
        "the parameters, their gradients and Adam's two moments, 4 bytes each in fp32.",
        f"Activations come and go: backward frees them, and at the step's peak they are **{share:.0%}** of what this "
        "small model holds; at real sizes they can dominate.",
    ], [
        f"Model states after the optimizer step: {per_param:.2f} bytes per parameter.",
        f"The model: the largest of the section 4 shapes, $L = {a['shape'][0]}$ blocks of width $h = {a['shape'][1]}$, "
        f"{n / 1e6:.1f} M parameters.",
        f"Activations: {acts / 2**20:.1f} MiB after forward, {m['after backward']['activations'] / 2**20:.2f} MiB "
        "after backward.",
    ])
