"""Lesson 09, section 1: a pipeline schedule drawn — which stage does which micro-batch when."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.layout import bubble_fraction
from labtools.pipeline import SCHEDULES, Schedule, idle_fraction, schedule_order, simulate
from labtools.widgets import Panel
from lessons.pipeline_parallel import Settings


def grid_figure(schedule: str, p: int, m: int, v: int = 1, asked_m: int | None = None) -> go.Figure:
    """The schedule on an idealised machine (forward 1 unit, backward 2, per rank), and its formula; asked_m: the
    m the learner chose, where the schedule had to run another (said in the title)."""
    vv = v if schedule == Schedule.INTERLEAVED else 1
    intervals = simulate(schedule_order(schedule, p, m, vv), 1.0, 2.0, vv)
    idle = idle_fraction(intervals, p)
    moved = f" (you chose {asked_m}: interleaving needs m a multiple of p)" if asked_m not in (None, m) else ""
    fig = plots.timeline(intervals, unit="time units (forward = 1)",
                         title=f"{schedule}, p = {p}, m = {m}{moved}{f', v = {vv}' if vv > 1 else ''}: idle "
                               f"{idle:.1%} — formula (p−1)/({'v·' if vv > 1 else ''}m+p−1) = "
                               f"{bubble_fraction(p, m, vv):.1%}")
    return fig


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
