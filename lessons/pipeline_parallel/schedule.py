"""Lesson 09, section 1: a pipeline schedule drawn — which stage does which micro-batch when."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most, in_words
from labtools.layout import bubble_fraction
from labtools.pipeline import SCHEDULES, Schedule, idle_fraction, schedule_order, simulate
from labtools.widgets import Panel
from lessons.pipeline_parallel import Settings


def grid_figure(schedule: str, p: int, m: int, v: int = 1, asked_m: int | None = None) -> go.Figure:
    """The schedule on an idealised machine (forward 1 unit, backward 2, per rank), and its formula; asked_m: the
    m the learner chose, where the schedule had to run another (said in the title)."""
    vv = v if schedule == Schedule.INTERLEAVED else 1
    intervals = simulate(schedule_order(schedule, p, m, vv), 1.0, 2.0, vv)
    idle, predicted = idle_fraction(intervals, p), bubble_fraction(p, m, vv)
    moved = f" (you chose {asked_m}: interleaving needs m a multiple of p)" if asked_m not in (None, m) else ""
    formula = f"(p−1)/({'v·' if vv > 1 else ''}m+p−1)"
    verdict = (f"as {formula} predicts" if abs(idle - predicted) < 0.005 else
               f"{formula} predicts {predicted:.0%}")
    return plots.timeline(intervals, unit="time units (forward = 1)",
                          title=f"{schedule}, p = {p}, m = {m}{moved}{f', v = {vv}' if vv > 1 else ''}: idle "
                                f"{idle:.0%} of the step, {verdict}")


def panel(S: Settings) -> Panel:
    """Schedule, p, m, v → the static grid and the formula, redrawn at once (no processes). v shows only under the
    interleaved schedule, the one it applies to."""
    def draw(schedule, p, m, v):
        schedule, asked = Schedule(schedule), m
        if schedule == Schedule.INTERLEAVED and m % p:
            m = p * max(1, round(m / p))  # interleaving needs m a multiple of p: the nearest one, said in the title
        return grid_figure(schedule, p, m, v, asked_m=asked)

    controls = {
        "schedule": W.Dropdown(options=[(s.value, s.value) for s in SCHEDULES], value=Schedule.ONE_F_ONE_B.value,
                               description="schedule"),
        "p": W.IntSlider(value=max(S.worlds), min=2, max=max(8, *S.worlds), description="stages p"),
        "m": W.IntSlider(value=S.m, min=1, max=max(32, S.m), description="micro-batches m"),
        "v": W.IntSlider(value=S.v, min=2, max=max(4, S.v), description="chunks per rank v (interleaved)"),
    }

    def show_v(change=None):
        controls["v"].layout.display = "" if controls["schedule"].value == Schedule.INTERLEAVED else "none"

    controls["schedule"].observe(show_v, names="value")
    show_v()
    return Panel(draw, controls, debounce_ms=0, title="A pipeline schedule, drawn from its order (forward 1, "
                                                      "backward 2)")


def findings(ledger: Ledger, S: Settings) -> Findings:
    """Section 1's answer, from the drawn schedules: GPipe and 1F1B idle the formula's share, interleaving less."""
    worst = 0.0
    for schedule in SCHEDULES:
        v = S.v if schedule == Schedule.INTERLEAVED else 1
        for p in S.worlds:
            for m in (*S.micro_batches, S.m):
                if v == 1 or m % p == 0:
                    drawn = idle_fraction(simulate(schedule_order(schedule, p, m, v), 1.0, 2.0, v), p)
                    worst = max(worst, abs(drawn - bubble_fraction(p, m, v)))
    ledger.add("drawn_formula", "Drawn on an idealised machine, GPipe and 1F1B idle (p−1)/(m+p−1) of the step and "
               f"interleaved 1F1B (p−1)/(v·m+p−1), v = {S.v} (worst gap over the depths and m the lesson runs)",
               worst, at_most(1e-9), kind="computed", detail=True)
    p, m = max(S.worlds), S.m
    idle = {s: idle_fraction(simulate(schedule_order(s, p, m, S.v if s == Schedule.INTERLEAVED else 1), 1.0, 2.0,
                                      S.v if s == Schedule.INTERLEAVED else 1), p) for s in SCHEDULES}
    same = abs(idle[Schedule.GPIPE] - idle[Schedule.ONE_F_ONE_B]) < 1e-9
    both = "GPipe and 1F1B idle the same share of the step" if same else "1F1B idles a share of the step"
    return Findings([
        f"{both}, **{idle[Schedule.ONE_F_ONE_B]:.0%}** at the deepest pipeline here; giving each rank "
        f"{in_words(S.v)} interleaved chunks cuts it to **{idle[Schedule.INTERLEAVED]:.0%}**, for "
        f"{'twice' if S.v == 2 else in_words(S.v) + ' times'} as many messages.",
    ], [f"Drawn at $p = {p}$ stages and $m = {m}$ micro-batches; interleaved with $v = {S.v}$ chunks per rank."])
