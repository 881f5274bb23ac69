"""Lesson 05, section 2: the step's peak — what recomputation needs held at once."""

import math

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least
from labtools.memory import (ANATOMY, ANATOMY_LABELS, MOMENTS, peak_bytes, saved_activation_bytes,
                             step_anatomy)
from labtools.progress import progress
from lessons.activation_checkpointing import MiB, Settings, batch, build, label, policies


def run(S: Settings) -> dict[tuple, dict]:
    """Saved bytes and the peak of a whole forward + backward, per policy, at the deepest sweep depth."""
    L = max(S.layers)
    X, Y = batch(S, S.seq_len, S.batch_size)
    out = {}
    for p, k in progress(policies(L) + [("every_k", 2)], desc="step peaks"):
        model = build(S, L, S.seq_len, p, k)
        saved = saved_activation_bytes(model, X, Y)
        peak = peak_bytes(lambda: model(X, Y)[1].backward(), model)
        out[(p, k)] = {"saved": saved, "peak": peak["total"] - peak["params"]}
    return out


def figure(S: Settings, pk: dict) -> go.Figure:
    names = [label(p, k, max(S.layers)) for p, k in pk]
    fig = plots.bars(names, {"kept between forward and backward": [v["saved"] / MiB for v in pk.values()],
                             "peak during the step (all but parameters)": [v["peak"] / MiB for v in pk.values()]},
                     title=f"L = {max(S.layers)}: what is kept vs what the step needs at its peak", yaxis="MiB")
    return fig


def findings(ledger: Ledger, S: Settings, pk: dict) -> Findings:
    L = max(S.layers)
    k = max(1, round(math.sqrt(L)))
    b, s = pk[("block", 1)], pk[("every_k", k)]
    if k > 1:
        ledger.add("sqrt_peak", f"√L segments keep less than every block but peak higher (peak of every {k} ÷ peak "
                   "of every block)", s["peak"] / b["peak"], at_least(1.1), kind="measured")
    ledger.note("peaks", {label(p, kk, L): v for (p, kk), v in pk.items()})
    table = "| policy | kept between forward and backward (MiB) | the step's peak (MiB) |\n|---|---|---|\n" + "\n".join(
        f"| {label(p, kk, L)} | {v['saved'] / MiB:.2f} | {v['peak'] / MiB:.2f} |" for (p, kk), v in pk.items())
    keeps_less = s["saved"] < b["saved"]
    return Findings([
        f"No: checkpointing segments of $\\sqrt L \\approx {k}$ blocks (of $L = {L}$) keeps "
        f"{'less' if keeps_less else 'no more'} than checkpointing every block, yet the step peaks "
        f"**{s['peak'] / b['peak']:.1f}×** higher, because backward recomputes a whole segment at once. The peak is "
        "what must fit.",
    ], [table, f"L = {L} blocks, everything but the parameters counted."])


ANATOMY_POLICIES = {"none": "no checkpointing", "block": "every block checkpointed"}


def anatomy(S: Settings) -> dict[str, dict]:
    """One AdamW step at the deepest sweep depth, moment by moment (labtools.memory.step_anatomy: torch's
    MemTracker), without checkpointing and with every block checkpointed."""
    L = max(S.layers)
    X, Y = batch(S, S.seq_len, S.batch_size)
    out = {}
    for p in ANATOMY_POLICIES:
        model = build(S, L, S.seq_len, p)
        out[p] = step_anatomy(model, torch.optim.AdamW(model.parameters(), lr=1e-3), X, Y)
    return out


def anatomy_figure(S: Settings, an: dict[str, dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=len(an), shared_yaxes=True, subplot_titles=list(ANATOMY_POLICIES.values()))
    for col, moments in enumerate(an.values(), start=1):
        for i, kind in enumerate(ANATOMY):
            fig.add_trace(go.Bar(x=list(MOMENTS), y=[moments[m][kind] / MiB for m in MOMENTS],
                                 name=ANATOMY_LABELS[kind], marker_color=plots.color(i), legendgroup=kind,
                                 showlegend=col == 1), row=1, col=col)
    fig.update_yaxes(title_text="MiB", row=1, col=1)
    plots.style(fig, f"One AdamW step at L = {max(S.layers)}: where its peak sits, without and with checkpointing",
                height=450,
                barmode="stack")
    return fig.update_layout(margin=dict(t=100))  # room for the title above the two panels' own


def anatomy_findings(ledger: Ledger, pk: dict, an: dict[str, dict]) -> Findings:
    acts = {p: an[p]["after forward"]["activations"] for p in ANATOMY_POLICIES}
    off = max(abs(acts[p] / pk[(p, 1)]["saved"] - 1) for p in ANATOMY_POLICIES)
    ledger.add("tracker_agrees", "Two instruments agree: the activations PyTorch's memory tracker sees after forward "
               "match the tensors autograd saved (counted above), with and without checkpointing (worst relative "
               "difference)", off, approx(0.0, abs=0.01), kind="measured")
    none, block = an["none"]["peak"], an["block"]["peak"]
    where = lambda pk: "in backward" if pk["grads"] > 0 else "at the end of forward"  # gradients exist only in backward
    rows = [("activations after forward", acts["none"], acts["block"])] + [
        (f"at the peak: {ANATOMY_LABELS[kind].lower()}", none[kind], block[kind])
        for kind in ANATOMY if kind != "params"]
    table = "| MiB | no checkpointing | every block checkpointed |\n|---|---|---|\n" + "\n".join(
        f"| {name} | {a / MiB:.2f} | {b / MiB:.2f} |" for name, a, b in rows)
    return Findings([
        f"Without checkpointing the step peaks {where(none)}, holding every activation; with every block "
        f"checkpointed it peaks {where(block)}, where the gradients build up beside one recomputed block.",
        f"The two instruments agree: the memory tracker's activations after forward match the count of saved tensors "
        f"within **{off:.1%}**.",
    ], [table])
