"""Lesson 09, section 4: the zero-bubble schedule ZBV — the backward split into I and W, drawn from the list of
actions torch's ScheduleZBVZeroBubble runs, beside 1F1B and beside the ranks' measured timeline."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.layout import bubble_fraction
from labtools.pipeline import (LETTERS, Schedule, decompose, from_torch, idle_fraction, in_flight, schedule_order,
                               simulate, split_backward)
from lessons.pipeline_parallel import Settings
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.ranks import Timeline


def runs_of(results: dict[int, DepthRun], schedule: Schedule) -> dict[int, list[Timeline]]:
    """{p: the timed runs of one schedule} (rank 0 gathered them)."""
    return {p: [run for run in r.timelines if run.schedule == schedule] for p, r in results.items()}


def runs(results: dict[int, DepthRun]) -> dict[int, Timeline]:
    """{p: the timed ZBV run} at the m the lesson ran it."""
    return {p: rs[-1] for p, rs in runs_of(results, Schedule.ZBV).items() if rs}


def listed(run: Timeline) -> list[list]:
    """Each rank's compute actions as torch listed them."""
    return [from_torch(actions) for actions in run.pipeline_order]


def timed(run: Timeline) -> list[list]:
    """Each rank's actions in the order its timer saw them run."""
    rows = sorted({iv["row"] for iv in run.intervals})
    return [[(LETTERS[iv["kind"]], iv["mb"], iv["stage"]) for iv in sorted(run.intervals, key=lambda iv: iv["start"])
             if iv["row"] == r] for r in rows]


def ran_as_listed(results: dict[int, DepthRun]) -> list[bool]:
    """For each run with a list (ZBV, the interleaved schedules): whether every rank ran torch's listed actions in
    their order."""
    return [timed(run) == [[(a.kind, a.mb, a.stage) for a in rank] for rank in listed(run)]
            for r in results.values() for run in r.timelines if run.pipeline_order]


def lab_order_matches(results: dict[int, DepthRun], v: int) -> list[bool]:
    """For each interleaved run: whether the lab's interleaved order (labtools.pipeline.schedule_order, section 1's
    panel) is the list torch's ScheduleInterleaved1F1B ran."""
    return [[[(a.kind, a.mb, a.stage) for a in rank] for rank in schedule_order(Schedule.INTERLEAVED, p, run.m, v)]
            == [[(a.kind, a.mb, a.stage) for a in rank] for rank in listed(run)]
            for p, rs in runs_of(results, Schedule.INTERLEAVED).items() for run in rs]


def figure(run: Timeline, p: int, S: Settings) -> go.Figure:
    """Four timelines at the same p and m, in units of one stage's forward, F = I = W: 1F1B as the lab writes it,
    with each backward whole and then split (I first); torch's ZBV list played; the ranks' measured ZBV step
    (padded to the same durations)."""
    m = run.m
    order = schedule_order(Schedule.ONE_F_ONE_B, p, m)
    measured = [dict(iv, start=iv["start"] / S.t_f_ms, end=iv["end"] / S.t_f_ms) for iv in run.intervals]
    parts = [("1F1B, each backward whole (B)", simulate(order, 1.0, 2.0)),
             ("1F1B, each backward split: I sent first, then W", simulate(split_backward(order), 1.0, 2.0)),
             ("ZBV, PyTorch's list: I as soon as it can, W into the gaps", simulate(listed(run), 1.0, 2.0, v=2)),
             ("ZBV on the ranks, measured", measured)]
    titles = [f"{name}: idle {idle_fraction(iv):.0%}" for name, iv in parts[:3]]
    titles.append(f"{parts[3][0]}: bubble {decompose(run.intervals)['bubble']:.0%}")
    fig = plots.subplots(4, 1, titles, title=f"Filling the bubble: p = {p} ranks, m = {m} micro-batches",
                         height=4 * (56 + 28 * p), shared_xaxes=True, vertical_spacing=0.07)
    shown = set()
    for row, (_, intervals) in enumerate(parts, start=1):
        for trace in plots.timeline(intervals, unit="forwards").data:
            trace.update(legendgroup=trace.name, showlegend=trace.name not in shown)
            shown.add(trace.name)
            fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=[f"rank {r}" for r in reversed(range(p))], row=row,
                         col=1)
    fig.update_layout(barmode="overlay", uniformtext=dict(minsize=8, mode="hide"))
    fig.update_xaxes(title_text="time, in units of one stage's forward", row=4, col=1)
    return fig


def findings(ledger: Ledger, S: Settings, results: dict[int, DepthRun]) -> Findings:
    zb = runs(results)
    if not zb:
        return Findings(["This run timed no zero-bubble schedule (`zero_bubble=False`)."])
    p = max(zb)
    run, m = zb[p], zb[p].m
    plain = bubble_fraction(p, m)
    meas = {q: decompose(r.intervals)["bubble"] for q, r in zb.items()}
    sims = {q: idle_fraction(simulate(listed(r), 1.0, 2.0, v=2)) for q, r in zb.items()}  # F = I = W
    sim = sims[p]
    ledger.add("zbv_idle_computed", f"p = {p}, m = {m}: PyTorch's ZBV list, played with F = I = W, idles less than "
               f"half of 1F1B's (p−1)/(m+p−1) = {plain:.1%} (the split backward fills the bubble with W)", sim,
               at_most(plain / 2), kind="computed")
    for q in sorted(zb):  # the deepest p is the headline; shallower ones repeat it, folded
        ledger.add(f"zbv_bubble_{q}", f"p = {q}, m = {zb[q].m}, ZBV on the ranks, simulated compute: the measured "
                   f"bubble is within 0.05 of its list's played idle fraction ({sims[q]:.1%}), not 1F1B's "
                   f"{bubble_fraction(q, zb[q].m):.1%}", meas[q], approx(sims[q], abs=0.05), kind="measured",
                   detail=q != p)
    same = ran_as_listed(results)
    ledger.add("torch_lists_ran", f"every rank ran exactly the actions PyTorch listed for it, in order ({len(same)} "
               "runs of ZBV and the interleaved schedules): the picture is the schedule that ran",
               all(same) and bool(same), is_true(), kind="measured", detail=True)
    ours = lab_order_matches(results, S.v)
    if ours:
        ledger.add("interleaved_order", f"the lab's interleaved order (section 1's panel) is the list PyTorch's "
                   f"interleaved 1F1B ran, on every rank ({len(ours)} runs)", all(ours), is_true(),
                   kind="measured", detail=True)
    held = max(in_flight(listed(run))) / 2  # two chunks per rank: a chunk's activations are half a stage's
    split = idle_fraction(simulate(split_backward(schedule_order(Schedule.ONE_F_ONE_B, p, m))))
    rows = "\n".join(f"| {q} | {zb[q].m} | {bubble_fraction(q, zb[q].m):.1%} | {sims[q]:.1%} | {meas[q]:.1%} |"
                      for q in sorted(zb))
    return Findings([
        f"Yes: once each backward is split into I and W, ZBV's list fills 1F1B's bubble with W. Played, it idles "
        f"**{sim:.1%}** of the step where 1F1B idles {plain:.1%}.",
        (f"On the ranks, ZBV's measured bubble was **{meas[p]:.1%}**, within five points of its list's {sim:.1%}: "
         "the ranks ran exactly the actions PyTorch listed, in order." if abs(meas[p] - sim) <= 0.05 and all(same) else
         f"On the ranks, ZBV's measured bubble was **{meas[p]:.1%}**, more than its list's, though the ranks ran the "
         "actions PyTorch listed, in order: on a busy machine a rank can wake late (rerun to see whether it holds)."
         if all(same) else
         f"On the ranks, ZBV's measured bubble was **{meas[p]:.1%}**, and some rank did not run the list as PyTorch "
         "wrote it."),
    ], [
        "| p | m | 1F1B's bubble | ZBV, played | ZBV, measured |\n|---|---|---|---|---|\n" + rows,
        f"Splitting alone helps: 1F1B that sends I before running W idles {split:.1%} at p = {p}, m = {m}.",
        f"ZBV costs no more activation memory: a rank holds at most {held:g} micro-batches' activations of a whole "
        f"stage, as 1F1B's first rank holds {min(p, m)} (counted from the lists; a chunk is half a stage)."
        if held <= min(p, m) else
        f"ZBV's ranks hold up to {held:g} micro-batches' activations of a whole stage, 1F1B's first rank {min(p, m)} "
        "(counted from "
        "the lists).",
    ])
