"""Lesson 09, section 2: every schedule's gradients, and 1F1B training, against one process."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most, is_true
from lessons.pipeline_parallel import CURVE_WINDOW
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.ranks import PARITY_SCHEDULES


def table(results: dict[int, DepthRun]) -> go.Figure:
    rows = []
    for p, r in results.items():
        for s in PARITY_SCHEDULES:
            entries = [rank.parity.schedules[s] for rank in r.ranks]
            ran = all(e.ran for e in entries)
            worst = max(e.max_grad_diff for e in entries) if ran else None
            rows.append((f"p = {p}", s, "ran" if ran else "failed: " + next(e.error for e in entries
                                                                         if not e.ran)[:60],
                         f"{worst:.1e}" if ran else "—"))
    return plots.table(("", "schedule", "on this backend", "max |Δ gradient| vs one process"), rows,
                       title="Every schedule's gradients against one process on the same batch")


def findings(ledger: Ledger, results: dict[int, DepthRun]) -> Findings:
    """One claim over every depth: the worst gradient difference, and the worst loss difference in training."""
    rows, worst, curve, missed, steps = [], 0.0, 0.0, {}, 0
    for p, r in results.items():
        backend = r.ranks.dist[0].backend
        per = {s: [rank.parity.schedules[s] for rank in r.ranks] for s in PARITY_SCHEDULES}
        ran = [s for s, e in per.items() if all(x.ran for x in e)]
        worst_p = max(x.max_grad_diff for s in ran for x in per[s])
        for s in PARITY_SCHEDULES[:5]:  # the written-out ones, GPipe, 1F1B, interleaved: zero-bubble may fail on gloo
            ledger.add(f"ran_{s}_{p}", f"p = {p}: {s} runs on {backend}", s in ran, is_true(), kind="measured",
                       detail=True)
        missed.update({f"{s} (p = {p})": True for s in PARITY_SCHEDULES if s not in ran})
        diffs = [abs(a - b) for a, b in zip(r.ranks[0].training.losses, r.single_losses)]
        steps = min(len(diffs), CURVE_WINDOW)
        curve_p = max(diffs[:CURVE_WINDOW])
        ledger.note(f"curve_{p}_whole_run", max(diffs))
        worst, curve = max(worst, worst_p), max(curve, curve_p)
        rows.append(f"| {p} | {backend} | {len(ran)} of {len(PARITY_SCHEDULES)} | {worst_p:.1e} | {curve_p:.1e} |")
    depths = " and ".join(str(p) for p in results)
    ledger.add("parity", f"p = {depths}: every schedule that ran gives one process's gradients (worst |Δ| over depths, "
               "ranks and schedules, fp32)", worst, at_most(1e-6), kind="measured")
    ledger.add("curve", f"p = {depths}: the first {steps} AdamW steps of 1F1B training match one process (worst "
               "|Δ loss|; rounding differs, so longer runs drift slowly)", curve, at_most(1e-3), kind="measured")
    answer = (f"Yes: every schedule, at every depth, gives one process's gradients to **{worst:.0e}**, fp32's "
              "rounding." if not missed else
              f"Every schedule that ran gives one process's gradients to **{worst:.0e}**; "
              f"{', '.join(missed)} failed on this backend.")
    return Findings([
        answer,
        f"Trained with 1F1B for {steps} steps, the pipeline's losses stay within **{curve:.0e}** of one process's.",
    ], ["| p | backend | schedules that ran | worst gradient difference | worst loss difference |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)])


def training_figure(results: dict[int, DepthRun]) -> go.Figure:
    fig = go.Figure()
    p0 = min(results)
    fig.add_trace(go.Scatter(y=results[p0].single_losses, name="one process", line=dict(width=5), opacity=0.35))
    for i, (p, r) in enumerate(results.items()):
        fig.add_trace(go.Scatter(y=r.ranks[0].training.losses, name=f"1F1B, {p} stages", mode="lines+markers",
                                 line=dict(dash="dot", color=plots.color(i + 1))))
    return plots.style(fig, "Training loss: a pipeline vs one process on the same batches", "step", "loss")
