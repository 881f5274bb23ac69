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
    """One claim over every tensor-parallel size: the worst difference of any module, version and rank."""
    rows, worst = [], 0.0
    for tp, r in res["tp"].items():
        worst_tp = max(v for x in r for part in x["parity"].values() for v in part.values())
        worst = max(worst, worst_tp)
        rows.append(f"| {tp} | {r[0]['dist']['backend']} | {worst_tp:.1e} |")
    sizes = " and ".join(str(tp) for tp in res["tp"])
    ledger.add("parity", f"tp = {sizes}: MLP, attention and the whole GPT — written out, DTensor, DTensor + SP — give "
               "one rank's outputs and gradients (worst |Δ| over sizes and ranks, fp32)", worst, at_most(1e-5),
               kind="measured")
    return Findings([
        f"Yes: written out, with DTensor, and with DTensor and sequence parallelism, every split module gives one "
        f"rank's outputs and gradients to **{worst:.0e}**, fp32's rounding.",
    ], ["| tp | backend | worst difference from one rank |\n|---|---|---|\n" + "\n".join(rows)])
