"""Lesson 10, section 5: dp × tp — training on a 2-D mesh against one process."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from lessons.tensor_parallel import CURVE_WINDOW
from lessons.tensor_parallel.launches import LessonRuns


def figure(res: LessonRuns) -> go.Figure:
    fig = go.Figure([go.Scatter(y=res.single.losses, name="one process", line=dict(width=5), opacity=0.35),
                     go.Scatter(y=res.two_d.losses, name="dp 2 × tp 2 (FSDP2 × DTensor TP)", mode="lines+markers",
                                line=dict(dash="dot"))])
    return plots.style(fig, "Training loss: 2-D parallel on 4 ranks vs one process", "step", "loss")


def findings(ledger: Ledger, res: LessonRuns) -> Findings:
    import numpy as np
    diffs = [abs(a - b) for a, b in zip(res.two_d.losses, res.single.losses)]
    grads = max(float(np.abs(np.array(res.two_d.first_grads_ln_1[k]) - np.array(v)).max())
                for k, v in res.single.first_grads_ln_1.items())
    ledger.add("two_d_grads", "dp 2 × tp 2: first-step gradients (gathered) equal one process's (max |Δ| over the "
               "LayerNorm gains, measured)", grads, at_most(1e-6), kind="measured")
    n = min(len(diffs), CURVE_WINDOW)
    ledger.add("two_d_curve", f"dp 2 × tp 2: the first {n} AdamW steps' losses match one process's (max |Δ|)",
               max(diffs[:CURVE_WINDOW]), at_most(1e-3), kind="measured")
    ledger.note("two_d_curve_whole_run", max(diffs))
    return Findings([
        f"Yes: on a 2-D mesh of four ranks, the first step's gradients equal one process's to **{grads:.0e}**, and "
        f"the losses follow one process's to **{max(diffs[:CURVE_WINDOW]):.0e}**.",
    ], [f"Losses: at most {max(diffs[:CURVE_WINDOW]):.1e} apart over the first {n} steps."]
       + ([f"Over all {len(diffs)} steps, at most {max(diffs):.1e} apart: last-bit differences grow."]
          if len(diffs) > n else []))
