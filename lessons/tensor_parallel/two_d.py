"""Lesson 10, section 5: dp × tp — training on a 2-D mesh against one process."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from lessons.tensor_parallel import CURVE_WINDOW


def figure(res: dict) -> go.Figure:
    fig = go.Figure([go.Scatter(y=res["single"]["losses"], name="one process", line=dict(width=5), opacity=0.35),
                     go.Scatter(y=res["two_d"]["losses"], name="dp 2 × tp 2 (FSDP2 × DTensor TP)", mode="lines+markers",
                                line=dict(dash="dot"))])
    return plots.style(fig, "Training loss: 2-D parallel on 4 ranks vs one process", "step", "loss")


def findings(ledger: Ledger, res: dict) -> Findings:
    import numpy as np
    diffs = [abs(a - b) for a, b in zip(res["two_d"]["losses"], res["single"]["losses"])]
    grads = max(float(np.abs(np.array(res["two_d"]["first_grads_ln_1"][k]) - np.array(v)).max())
                for k, v in res["single"]["first_grads_ln_1"].items())
    ledger.add("two_d_grads", "dp 2 × tp 2: first-step gradients (gathered) equal one process's (max |Δ| over the "
               "LayerNorm gains, measured)", grads, at_most(1e-6), kind="measured")
    ledger.add("two_d_curve", f"… and the first {min(len(diffs), CURVE_WINDOW)} AdamW steps' losses match (max |Δ|)",
               max(diffs[:CURVE_WINDOW]), at_most(1e-3), kind="measured")
    ledger.note("two_d_curve_whole_run", max(diffs))
    return Findings([
        f"First-step gradients differ from one process's by **{grads:.1e}**.",
        f"Losses differ by at most **{max(diffs[:CURVE_WINDOW]):.1e}** over the first {min(len(diffs), CURVE_WINDOW)} "
        f"steps, and by {max(diffs):.1e} over all {len(diffs)}.",
    ])
