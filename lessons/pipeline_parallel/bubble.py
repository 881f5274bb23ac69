"""Lesson 09, section 3: measured timelines and the bubble fraction against the formula."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.pipeline import SCHEDULES, Schedule, decompose, idle_per_row
from labtools.plan import bubble_fraction, pipeline_efficiency
from lessons.pipeline_parallel import QUOTED_EFFICIENCY, Settings
from lessons.pipeline_parallel.order_exercise import rule_orders, torch_orders


def measured(results: dict[int, dict], real: bool = False) -> dict[tuple[int, Schedule, int], list[dict]]:
    """{(p, schedule, m): intervals} of the simulated (or real) compute runs of the schedules the formula covers
    (zero_bubble.py draws ZBV's)."""
    out = {}
    for p, r in results.items():
        for run in (r["real"] if real else r["ranks"][0]["timelines"]) or []:
            if run["schedule"] in SCHEDULES:
                out[(p, Schedule(run["schedule"]), run["m"])] = run["intervals"]
    return out


def formula(p: int, schedule: str, m: int, v: int) -> float:
    return bubble_fraction(p, m, v if schedule == Schedule.INTERLEAVED else 1)


def timeline_figure(intervals: list[dict], p: int, schedule: str, m: int, v: int, real: bool = False) -> go.Figure:
    d = decompose(intervals)
    per_rank = ", ".join(f"rank {r} {x:.0%}" for r, x in idle_per_row(intervals).items())
    fig = plots.timeline(intervals, unit="ms", title=f"{schedule}, p = {p}, m = {m} — measured "
                         f"({'real' if real else 'simulated'} compute): bubble {d['bubble']:.1%} + latency "
                         f"{d['latency']:.1%}; formula {formula(p, schedule, m, v):.1%}")
    fig.add_annotation(text=f"idle per rank: {per_rank}", xref="paper", yref="paper", x=0, y=-0.32,
                       showarrow=False, xanchor="left")
    return fig


def figure(runs: dict[tuple, list[dict]], v: int, title: str) -> go.Figure:
    """Measured bubble (filled markers) and all idle time, latency included (open markers), against the formula."""
    fig = go.Figure()
    ms = sorted({m for (_, _, m) in runs})
    dense = [x / 4 for x in range(4, 4 * max(ms) + 1)]
    for i, p in enumerate(sorted({p for (p, _, _) in runs})):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (x + p - 1) for x in dense], mode="lines", line=dict(color=c),
                                 name=f"(p−1)/(m+p−1), p = {p}"))
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (v * x + p - 1) for x in dense], mode="lines",
                                 line=dict(color=c, dash="dot"), name=f"(p−1)/(v·m+p−1), p = {p}, v = {v}"))
        for schedule, symbol in zip(SCHEDULES, ("circle", "diamond", "x")):
            pts = sorted((m, decompose(iv)) for (pp, s, m), iv in runs.items() if pp == p and s == schedule)
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


def findings(ledger: Ledger, S: Settings, results: dict[int, dict]) -> Findings:
    runs = measured(results)
    parts = {key: decompose(iv) for key, iv in runs.items()}
    gaps = {key: d["bubble"] - formula(key[0], key[1], key[2], S.v) for key, d in parts.items()}
    for p in results:
        for schedule in SCHEDULES:
            keys = [k for k in gaps if k[0] == p and k[1] == schedule]
            if keys:
                worst = max(keys, key=lambda k: abs(gaps[k]))
                f = "(p−1)/(v·m+p−1)" if schedule == Schedule.INTERLEAVED else "(p−1)/(m+p−1)"
                ledger.add(f"bubble_{schedule}_{p}", f"p = {p}, {schedule}, simulated compute: the measured bubble is "
                           f"within 0.05 of {f} for every m swept (worst |measured − formula|, at m = {worst[2]})",
                           abs(gaps[worst]), at_most(0.05), kind="measured")
    key = (4, Schedule.ONE_F_ONE_B, 16)
    key = key if key in runs else max(runs, key=lambda k: (k[0], k[2]))
    p, m = key[0], key[2]
    quoted_idle = 1 - QUOTED_EFFICIENCY  # what "η = 78.9%" would leave idle
    ledger.add("quoted_78_9", f"p = {p}, m = {m} ({key[1]}): the measured bubble, latency separated, is the "
               f"formula's (p−1)/(m+p−1) = {bubble_fraction(p, m):.1%}, not the {quoted_idle:.1%} that \"η = 78.9%\" "
               "leaves idle (within 0.025: the two are 0.05 apart)", parts[key]["bubble"],
               approx(bubble_fraction(p, m), abs=0.025),
               source="a widely repeated calculation: η = (m−1)/(m+p−1) = 15/19", kind="measured")
    ran = torch_orders(results)
    ledger.add("torch_1f1b_order", "torch's Schedule1F1B ran, on every rank, the order "
               f"labtools.pipeline.schedule_order gives ({len(ran)} timed runs, m ≥ p; the exercise's rule)",
               all(orders == rule_orders(p_, m_) for (p_, m_), orders in ran.items()) and bool(ran), is_true(),
               kind="measured")
    ledger.note("bubble_gaps", {f"p{k[0]} {k[1]} m{k[2]}": g for k, g in gaps.items()})
    ledger.note("latency", {f"p{k[0]} {k[1]} m{k[2]}": d["latency"] for k, d in parts.items()})
    overruns = sum(r["overruns"] for res in results.values() for r in res["ranks"])
    worst = max(gaps.values(), key=abs)
    lat = [d["latency"] for d in parts.values()]
    return Findings([
        f"With each forward padded to {S.t_f_ms:g} ms and each backward to {2 * S.t_f_ms:g} ms, the measured bubble "
        f"followed the formula: the worst gap over {len(gaps)} runs was **{worst:+.3f}**.",
        f"On top of it, {min(lat):.1%}–{max(lat):.1%} of the time was *latency*: the input existed but had not "
        "arrived yet (the message, the schedule's bookkeeping, a rank waking up).",
        f"At p = {p}, m = {m} the bubble was **{parts[key]['bubble']:.1%}**: the formula's {p - 1}/{m + p - 1} = "
        f"{bubble_fraction(p, m):.1%}, so the efficiency is {pipeline_efficiency(p, m):.1%}, not 78.9%.",
        f"{overruns} actions overran their simulated time.",
    ])


def real_findings(ledger: Ledger, S: Settings, results: dict[int, dict]) -> Findings:
    runs = measured(results, real=True)
    if not runs:
        return Findings(["This profile runs simulated compute only; the `cpu` and `gpu` profiles also time the real "
                         "computation."])
    ledger.note("real_idle", {f"p{p} {s} m{m}": decompose(iv) for (p, s, m), iv in runs.items()})
    by_p = {p: [1 - decompose(iv)["busy"] for (pp, s, m), iv in runs.items() if pp == p] for p in results}
    return Findings([f"With real compute, p = {p}: idle **{min(v):.0%}–{max(v):.0%}** over the sweep."
                     for p, v in by_p.items() if v])
