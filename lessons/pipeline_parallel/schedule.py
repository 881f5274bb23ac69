"""Lesson 09, section 1: a pipeline schedule drawn — which stage does which micro-batch when."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.pipeline import SCHEDULES, Schedule, idle_fraction, schedule_order, simulate
from labtools.plan import bubble_fraction
from labtools.widgets import Panel
from lessons.pipeline_parallel import Settings


def grid_figure(schedule: str, p: int, m: int, v: int = 1) -> go.Figure:
    """The schedule on an idealised machine (forward 1 unit, backward 2, per rank), and its formula."""
    vv = v if schedule == Schedule.INTERLEAVED else 1
    intervals = simulate(schedule_order(schedule, p, m, vv), 1.0, 2.0, vv)
    idle = idle_fraction(intervals, p)
    fig = plots.timeline(intervals, unit="time units (forward = 1)",
                         title=f"{schedule}, p = {p}, m = {m}{f', v = {vv}' if vv > 1 else ''}: idle {idle:.1%} — "
                               f"formula (p−1)/({'v·' if vv > 1 else ''}m+p−1) = {bubble_fraction(p, m, vv):.1%}")
    return fig


def panel(S: Settings) -> Panel:
    """Schedule, p, m, v → the static grid and the formula, redrawn at once (no processes)."""
    def draw(schedule, p, m, v):
        if schedule == Schedule.INTERLEAVED and m % p:
            m = p * max(1, round(m / p))  # interleaving needs m a multiple of p: the nearest one
        return grid_figure(schedule, p, m, v)

    style = {"description_width": "initial"}
    controls = {
        "schedule": W.Dropdown(options=[(str(s), s) for s in SCHEDULES], value=Schedule.ONE_F_ONE_B,
                               description="schedule"),
        "p": W.IntSlider(value=max(S.worlds), min=2, max=8, description="stages p", style=style),
        "m": W.IntSlider(value=S.m, min=1, max=max(32, S.m), description="micro-batches m", style=style),
        "v": W.IntSlider(value=S.v, min=2, max=max(4, S.v), description="chunks per rank v (interleaved)", style=style),
    }
    return Panel(draw, controls, debounce_ms=0, title="A pipeline schedule, drawn from its order (forward 1, "
                                                      "backward 2)")
