"""Lesson 10, sections 1–2: column/row-parallel layers and the whole model against one process."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most


def table(res: dict) -> go.Figure:
    rows = []
    for t, r in res["tp"].items():
        p = r[0]["parity"]
        rows += [(f"tp = {t}", part, f"{p[part]['written-out']:.1e}", f"{p[part]['dtensor']:.1e}", "—")
                 for part in ("mlp", "attention")]
        rows.append((f"tp = {t}", "whole GPT", f"{p['gpt']['written-out']:.1e}", f"{p['gpt']['dtensor']:.1e}",
                     f"{p['gpt']['dtensor+sp']:.1e}"))
    return plots.table(("", "module", "written out (f, g)", "DTensor TP", "DTensor TP + SP"), rows,
                       title="Max |Δ| of outputs and gradients against the same module on one rank (fp32)")


def findings(ledger: Ledger, res: dict) -> Findings:
    parts = []
    for t, r in res["tp"].items():
        worst = max(v for x in r for part in x["parity"].values() for v in part.values())
        backend = r[0]["dist"]["backend"]
        ledger.add(f"parity_{t}", f"tp = {t}: MLP, attention and the whole GPT — written out, DTensor, DTensor + SP — "
                   "give one rank's outputs and gradients (max |Δ| over ranks, fp32, measured)", worst, at_most(1e-5),
                   kind="measured")
        parts.append(f"**tp = {t}** ({backend}): outputs and gradients differ from one rank's by at most "
                     f"**{worst:.1e}**.")
    return Findings(parts)
