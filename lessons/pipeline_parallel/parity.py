"""Lesson 09, section 2: every schedule's gradients, and 1F1B training, against one process."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most, is_true
from lessons.pipeline_parallel import CURVE_WINDOW
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.ranks import PARITY_SCHEDULES


def findings(ledger: Ledger, results: dict[int, DepthRun]) -> Findings:
    """One claim over every depth: the worst gradient difference, and the worst loss difference in training."""
    rows, worst, curve, missed, steps, essential, backends = [], 0.0, 0.0, {}, 0, True, set()
    for p, r in results.items():
        backend = r.ranks.dist[0].backend
        per = {s: [rank.parity.schedules[s] for rank in r.ranks] for s in PARITY_SCHEDULES}
        ran = [s for s, e in per.items() if all(x.ran for x in e)]
        worst_p = max(x.max_grad_diff for s in ran for x in per[s])
        essential &= all(s in ran for s in PARITY_SCHEDULES[:5])
        backends.add(backend)
        missed.update({f"{s} (p = {p})": True for s in PARITY_SCHEDULES if s not in ran})
        diffs = [abs(a - b) for a, b in zip(r.ranks[0].training.losses, r.single_losses)]
        steps = min(len(diffs), CURVE_WINDOW)
        curve_p = max(diffs[:CURVE_WINDOW])
        ledger.note(f"curve_{p}_whole_run", max(diffs))
        worst, curve = max(worst, worst_p), max(curve, curve_p)
        rows.append(f"| {p} | {backend} | {len(ran)} of {len(PARITY_SCHEDULES)} | {worst_p:.1e} | {curve_p:.1e} |")
    depths = " and ".join(str(p) for p in results)
    # the written-out ones, GPipe, 1F1B and interleaved must run; zero-bubble ones may fail on gloo
    ledger.add("ran", f"p = {depths}: the written-out GPipe and 1F1B and PyTorch's GPipe, 1F1B and interleaved "
               f"1F1B all ran on {' and '.join(sorted(backends))}", essential, is_true(), kind="measured", detail=True)
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
