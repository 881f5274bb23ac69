"""Lesson 05, section 2: the step's peak — what recomputation needs held at once."""

import math

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_least
from labtools.memory import peak_bytes, saved_activation_bytes
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
    return Findings([
        f"At L = {L}, √L segments (every {k} blocks) kept **{s['saved'] / MiB:.1f} MiB** between forward and "
        f"backward, less than checkpointing every block ({b['saved'] / MiB:.1f} MiB).",
        f"But the step's peak was **{s['peak'] / MiB:.1f} MiB** against {b['peak'] / MiB:.1f} MiB: backward "
        "recomputes a whole segment at once.",
    ])
