"""Lesson 09, section 3: measured timelines and the bubble fraction against the formula."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.layout import bubble_fraction
from labtools.pipeline import SCHEDULES, Schedule, decompose
from lessons.pipeline_parallel import QUOTED_EFFICIENCY, Settings
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.order_exercise import rule_orders, torch_orders
from lessons.pipeline_parallel.ranks import QUOTED_PAD, Timeline


def measured(results: dict[int, DepthRun], real: bool = False) -> list[Timeline]:
    """The simulated (or real) compute runs of the schedules the formula covers, every depth's in turn
    (zero_bubble.py draws ZBV's)."""
    return [run for r in results.values() for run in (r.real if real else r.timelines) or []
            if run.schedule in SCHEDULES]


def label(run: Timeline) -> str:
    """"p4 1f1b m16": a run as the ledger's notes name it."""
    return f"p{run.p} {run.schedule} m{run.m}"


def formula(p: int, schedule: str, m: int, v: int) -> float:
    return bubble_fraction(p, m, v if schedule == Schedule.INTERLEAVED else 1)


def timeline_figure(intervals: list[dict], p: int, schedule: str, m: int, v: int, real: bool = False) -> go.Figure:
    d = decompose(intervals)
    idle = d["bubble"] + d["latency"]
    return plots.timeline(intervals, unit="ms", title=f"{schedule}, p = {p}, m = {m}, "
                          f"{'real' if real else 'simulated'} compute: the ranks idled {idle:.0%} of the step, the "
                          f"formula predicts {formula(p, schedule, m, v):.0%}")


def figure(runs: list[Timeline], v: int, title: str) -> go.Figure:
    """Measured bubble (filled markers) and all idle time, latency included (open markers), against the formula."""
    fig = go.Figure()
    ms = sorted({run.m for run in runs})
    dense = [x / 4 for x in range(4, 4 * max(ms) + 1)]
    for i, p in enumerate(sorted({run.p for run in runs})):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (x + p - 1) for x in dense], mode="lines", line=dict(color=c),
                                 name=f"(p−1)/(m+p−1), p = {p}"))
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (v * x + p - 1) for x in dense], mode="lines",
                                 line=dict(color=c, dash="dot"), name=f"(p−1)/(v·m+p−1), p = {p}, v = {v}"))
        for schedule, symbol in zip(SCHEDULES, ("circle", "diamond", "x")):
            pts = sorted((run.m, decompose(run.intervals)) for run in runs if run.p == p and run.schedule == schedule)
            if pts:
                fig.add_trace(go.Scatter(x=[a for a, _ in pts], y=[d["bubble"] for _, d in pts], mode="markers",
                                         marker=dict(color=c, symbol=symbol, size=10),
                                         name=f"bubble, {schedule}, p = {p}"))
                fig.add_trace(go.Scatter(x=[a for a, _ in pts], y=[1 - d["busy"] for _, d in pts], mode="markers",
                                         marker=dict(color=c, symbol=f"{symbol}-open", size=10),
                                         name=f"all idle, {schedule}, p = {p}"))
    plots.style(fig, title, "micro-batches m", "fraction of ranks × step time", height=460, legend="right")
    fig.update_xaxes(type="log")
    return fig


def timeline_findings(ledger: Ledger, S: Settings, results: dict[int, DepthRun]) -> Findings:
    """Section 3: the timed runs are the schedule — torch's 1F1B ran the lab's order on every rank, and the padding
    held (actions that overran their simulated time)."""
    ran = torch_orders(results)
    same = all(run.orders == rule_orders(run.p, run.m) for run in ran) and bool(ran)
    ledger.add("torch_1f1b_order", "PyTorch's 1F1B ran, on every rank, the order section 1 draws and the "
               f"exercise's rule gives ({len(ran)} timed runs, m ≥ p)", same, is_true(), kind="measured")
    overruns = sum(rk.overruns for res in results.values() for rk in res.ranks)
    actions = sum(len(run.intervals) for res in results.values() for run in res.timelines)
    answer = ("Yes: on every rank, PyTorch's 1F1B ran its actions in the order section 1 draws, each padded to its "
              "simulated time." if same else
              "Not quite: on some rank, PyTorch's 1F1B ran another order than section 1 draws.")
    if overruns > 0.05 * actions:
        answer += f" But **{overruns / actions:.0%}** of the actions overran it, and stretch the timelines."
    return Findings([answer], [
        f"Each forward padded to {S.t_f_ms:g} ms and each backward to {S.t_b_ms:g} ms (the quoted case of section 4: "
        f"{QUOTED_PAD:g} times as long, so that a hop between ranks weighs less).",
        f"{overruns} of {actions:,} timed actions overran their simulated time (their real compute took longer).",
    ])


def findings(ledger: Ledger, S: Settings, results: dict[int, DepthRun]) -> Findings:
    runs = measured(results)
    parts = [decompose(run.intervals) for run in runs]
    gaps = [d["bubble"] - formula(run.p, run.schedule, run.m, S.v) for run, d in zip(runs, parts)]
    worst = max(range(len(runs)), key=lambda i: abs(gaps[i]))
    depths = " and ".join(str(p) for p in results)
    ledger.add("bubble", f"Simulated compute, p = {depths}: the measured bubble of GPipe, 1F1B and interleaved 1F1B "
               "is within 0.05 of (p−1)/(m+p−1), or (p−1)/(v·m+p−1), for every m swept (worst |measured − "
               f"formula|, at p = {runs[worst].p}, {runs[worst].schedule}, m = {runs[worst].m})", abs(gaps[worst]),
               at_most(0.05), kind="measured")
    at = next((i for i, run in enumerate(runs) if (run.p, run.schedule, run.m) == (4, Schedule.ONE_F_ONE_B, 16)),
              None)
    at = at if at is not None else max(range(len(runs)), key=lambda i: (runs[i].p, runs[i].m))
    p, m, bubble = runs[at].p, runs[at].m, parts[at]["bubble"]
    quoted_idle = 1 - QUOTED_EFFICIENCY  # what an efficiency of 78.9% would leave idle
    ledger.add("quoted_78_9", f"p = {p}, m = {m} ({runs[at].schedule}): the measured bubble, latency separated, is "
               f"the formula's (p−1)/(m+p−1) = {bubble_fraction(p, m):.1%}, not the {quoted_idle:.1%} that the quoted "
               "efficiency of 78.9% leaves idle (within 0.025: the two are 0.05 apart)", bubble,
               approx(bubble_fraction(p, m), abs=0.025),
               source="a widely repeated calculation: efficiency = (m−1)/(m+p−1) = 15/19", kind="measured")
    ledger.note("bubble_gaps", {label(run): g for run, g in zip(runs, gaps)})
    ledger.note("latency", {label(run): d["latency"] for run, d in zip(runs, parts)})
    lat = [d["latency"] for d in parts]
    rows = []
    for q in results:
        for schedule in SCHEDULES:
            these = [i for i, run in enumerate(runs) if run.p == q and run.schedule == schedule]
            if these:
                w = max(these, key=lambda i: abs(gaps[i]))
                rows.append(f"| {q} | {schedule} | {len(these)} | {gaps[w]:+.3f} (m = {runs[w].m}) | "
                            f"{max(parts[i]['latency'] for i in these):.1%} |")
    table = ("| p | schedule | runs | worst gap, measured − formula | most latency |\n|---|---|---|---|---|\n"
             + "\n".join(rows))
    near = abs(bubble - bubble_fraction(p, m)) <= 0.025
    return Findings([
        (f"Yes: with simulated compute, the measured bubble stayed within **{abs(gaps[worst]):.2f}** of the formula "
         f"in all {len(gaps)} runs; latency came on top of it." if abs(gaps[worst]) <= 0.05 else
         f"Roughly: with simulated compute the bubble tracked the formula, but one run idled **{gaps[worst]:+.2f}** "
         "beyond it: on a busy machine a rank can wake late. Rerun to see whether it holds."),
        (f"The widely repeated {QUOTED_EFFICIENCY:.1%} is off by one micro-batch: in that very case the run idled "
         f"**{bubble:.1%}**, near what the formula predicts."
         if near else
         f"In the quoted case the run idled **{bubble:.1%}**, farther from the formula's "
         f"{bubble_fraction(p, m):.1%} than this lesson claims."),
    ], [table, f"Latency, the input existing but not yet arrived, took {min(lat):.1%} to {max(lat):.1%} of a step."])


def real_findings(ledger: Ledger, S: Settings, results: dict[int, DepthRun]) -> Findings:
    runs = measured(results, real=True)
    if not runs:
        return Findings(["This run cannot say: the `smoke` profile times simulated compute only. The `cpu` and `gpu` "
                         "profiles also time the real computation."])
    ledger.note("real_idle", {label(run): decompose(run.intervals) for run in runs})
    by_p = {p: [1 - decompose(run.intervals)["busy"] for run in runs if run.p == p] for p in results}
    over = [1 - decompose(run.intervals)["busy"] - formula(run.p, run.schedule, run.m, S.v) for run in runs]
    most = max(range(len(runs)), key=lambda i: over[i])
    rows = [f"| {p} | {min(v):.0%} | {max(v):.0%} |" for p, v in by_p.items() if v]
    return Findings([
        f"With real compute the ranks idled up to **{over[most]:.0%}** of the step more than the formula: here a rank "
        "also waits for a core, and for the schedule's bookkeeping."
        if over[most] > 0.05 else
        f"With real compute the ranks idled within **{over[most]:+.0%}** of the formula: this machine ran them like "
        "separate devices.",
    ], ["| p | least idle | most idle |\n|---|---|---|\n" + "\n".join(rows),
        f"The most beyond the formula: p = {runs[most].p}, {runs[most].schedule}, m = {runs[most].m}."])
