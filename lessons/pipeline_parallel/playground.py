"""Lesson 09, section 5: panels over the measured runs, and exercises."""

from dataclasses import replace

import ipywidgets as W

from labtools.claims import Ledger
from labtools.layout import bubble_fraction, pipeline_efficiency
from labtools.parallel import launch
from labtools.pipeline import SCHEDULES, Schedule
from labtools.quiz import Question, answer_check
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.pipeline_parallel import Settings, ranks
from lessons.pipeline_parallel.bubble import measured, timeline_figure
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.ranks import runs_at


def measured_panel(S: Settings, results: dict[int, DepthRun]) -> tuple[Panel, RunCache]:
    """p, schedule, m → the measured (simulated-compute) timeline: from this notebook's runs, or a short launch."""
    runs = measured(results)

    def launch_one(p, schedule, m):
        res = launch(ranks.timelines, p, replace(S, schedules=(schedule,), micro_batches=(m,)),
                     desc=f"{schedule} × {p}, m = {m}", timeout_s=None)
        return res[0].timelines[0].intervals  # the one run asked for

    cache = RunCache(launch_one)
    for run in runs:
        cache.store[cache.key(dict(p=run.p, schedule=run.schedule, m=run.m))] = run.intervals

    def draw(p, schedule, m):
        schedule = Schedule(schedule)  # the control holds the plain name (its starting value prints as one)
        if not runs_at(schedule, p, m):
            raise ValueError(f"{schedule} does not run at p = {p}, m = {m} (1F1B needs m ≥ p, interleaving m a "
                             "multiple of p)")
        return timeline_figure(cache(p=p, schedule=schedule, m=m), p, schedule, m, S.v)

    controls = {
        "p": W.SelectionSlider(options=list(S.worlds), value=max(S.worlds), description="stages p"),
        "schedule": W.Dropdown(options=[(s.value, s.value) for s in SCHEDULES], value=Schedule.ONE_F_ONE_B.value,
                               description="schedule"),
        "m": W.SelectionSlider(options=sorted(set(S.micro_batches) | {S.m}), value=max(S.worlds) * 2
                               if max(S.worlds) * 2 in S.micro_batches else S.m, description="m"),
    }
    return Panel(draw, controls, title="A measured timeline (new settings launch a short run)",
                 cancellable=True), cache


def exercises(ledger: Ledger) -> list[Question]:
    m_needed = next(m for m in range(1, 10_000) if bubble_fraction(8, m) <= 0.05)
    llama = bubble_fraction(16, 16)
    v_needed = next(v for v in range(1, 64) if bubble_fraction(16, 16, v) <= 0.2)
    ledger.note("plain_1f1b_pp16_m16_idle", llama)  # 15/31: a formula, noted rather than claimed

    return [
        Question("The quoted efficiency", "4 stages, 16 micro-batches, GPipe or 1F1B: what fraction of the time is "
                 "idle, and what fraction is useful work (in %)?", {"bubble": "bubble %", "eff": "efficiency %"},
                 answer_check({"bubble": 100 * bubble_fraction(4, 16), "eff": 100 * pipeline_efficiency(4, 16)}),
                 f"Bubble $(p-1)/(m+p-1) = 3/19$ = **{bubble_fraction(4, 16):.1%}**; efficiency $m/(m+p-1) = 16/19$ "
                 f"= **{pipeline_efficiency(4, 16):.1%}**. The quoted $(m-1)/(m+p-1) = 15/19$ counts one micro-batch "
                 "too few as work."),
        Question("Enough micro-batches", "With p = 8 stages, how many micro-batches m make the bubble at most 5%?",
                 {"m": "smallest m"}, answer_check({"m": m_needed}),
                 f"$(p-1)/(m+p-1) \\le 0.05 \\iff m \\ge 19(p-1)$: **m = {m_needed}**. Deep pipelines need large "
                 "global batches — or interleaving."),
        Question("Interleaving a deep pipeline", "Llama 3 405B was trained with 16 pipeline stages and an interleaved "
                 "schedule. With as many micro-batches as stages, how many chunks of layers per rank (v) bring the "
                 "bubble to at most 20%?", {"v": "smallest v"}, answer_check({"v": v_needed}),
                 f"$15/(16v + 15) \\le 0.2 \\iff v \\ge 3.75$: **v = {v_needed}**, a bubble of "
                 f"{bubble_fraction(16, 16, v_needed):.0%}. Each rank then sends $v$ times as many activations: "
                 "interleaving trades communication for idle time."),
    ]
