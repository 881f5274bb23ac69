"""Lesson 10, the picture of the split: one MLP on tp ranks, column- then row-parallel, each tensor drawn with the
shape it has on a rank (from the lesson's model), and where copy and reduce (Megatron's f and g) communicate; with
sequence parallelism, the sequence-split regions and their all-gather and reduce-scatter. A panel steps tp and
switches SP on and off."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.controls import options_with
from labtools.widgets import Panel
from lessons.tensor_parallel import Settings

WHOLE, SHARD, PARTIAL = "#cccccc", plots.color(0), "#ff9f40"
COMM = "#cf222e"


def _box(fig: go.Figure, x: float, y: float, w: float, h: float, color: str, text: str, hover: str) -> None:
    fig.add_shape(type="rect", x0=x - w / 2, x1=x + w / 2, y0=y - h / 2, y1=y + h / 2, fillcolor=color,
                  line=dict(color="white", width=1), layer="below")
    ink = "white" if color == SHARD else "black"
    fig.add_trace(go.Scatter(x=[x], y=[y], mode="text", text=[text], textfont=dict(size=11, color=ink),
                             hovertext=[hover], hoverinfo="text", showlegend=False))


def _comm(fig: go.Figure, x: float, y: float, text: str, hover: str) -> None:
    fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers+text", text=[text], textposition="top center",
                             marker=dict(symbol="diamond", size=16, color=COMM), textfont=dict(color=COMM, size=11),
                             hovertext=[hover], hoverinfo="text", showlegend=False))


def figure(h: int, tokens: int, tp: int, sequence_parallel: bool) -> go.Figure:
    """Rows: ranks 0 … tp−1. Left to right: the MLP's input, copy, c_fc's column shard, the hidden units after GELU,
    c_proj's row shard, the partial output, reduce, the output. Grey: whole on every rank; blue: a shard; orange: a
    partial sum that reduce completes."""
    fig = go.Figure()
    n = tokens // tp
    cols = [0, 1.1, 2.2, 3.4, 4.6, 5.8, 6.9, 8.0]
    for r in range(tp):
        y = -r * 1.3
        x_in = (f"x {n}×{h}", SHARD, f"rank {r}'s {n} of {tokens} tokens: sequence-parallel region") \
            if sequence_parallel else (f"x {tokens}×{h}", WHOLE, "the whole input, on every rank")
        _box(fig, cols[0], y, 0.95, 0.8, x_in[1], x_in[0], x_in[2])
        _box(fig, cols[2], y, 0.95, 0.8, SHARD, f"c_fc {4 * h // tp}×{h}",
             f"rows {r * 4 * h // tp}…{(r + 1) * 4 * h // tp - 1} of c_fc's weight: column-parallel")
        _box(fig, cols[3], y, 0.95, 0.8, SHARD, f"gelu {tokens}×{4 * h // tp}",
             "this rank's hidden units, for every token: no communication needed")
        _box(fig, cols[4], y, 0.95, 0.8, SHARD, f"c_proj {h}×{4 * h // tp}",
             f"columns {r * 4 * h // tp}…{(r + 1) * 4 * h // tp - 1} of c_proj's weight: row-parallel")
        _box(fig, cols[5], y, 0.95, 0.8, PARTIAL, f"partial {tokens}×{h}",
             "this rank's share of every output: the sum over ranks is the output")
        y_out = (f"y {n}×{h}", SHARD, "after reduce-scatter: the sum, for this rank's tokens only") \
            if sequence_parallel else (f"y {tokens}×{h}", WHOLE, "after all-reduce: the whole output, on every rank")
        _box(fig, cols[7], y, 0.95, 0.8, y_out[1], y_out[0], y_out[2])
        fig.add_annotation(x=-0.75, y=y, text=f"rank {r}", showarrow=False, xanchor="right")
    mid = -(tp - 1) * 1.3 / 2
    if sequence_parallel:
        _comm(fig, cols[1], mid, "all-gather", "forward: gather every rank's tokens; backward: reduce-scatter")
        _comm(fig, cols[6], mid, "reduce-scatter", "forward: sum and keep this rank's tokens; backward: all-gather")
    else:
        _comm(fig, cols[1], mid, "copy: identity", "forward: nothing (the input is already on every rank); "
                                                   "backward: all-reduce of the input's gradient")
        _comm(fig, cols[6], mid, "reduce: all-reduce", "forward: all-reduce of the partial outputs; backward: nothing")
    for x in (cols[1], cols[6]):
        fig.add_shape(type="line", x0=x, x1=x, y0=0.5, y1=-(tp - 1) * 1.3 - 0.5, line=dict(color=COMM, dash="dot"),
                      layer="below")
    for kind, color in (("whole on every rank", WHOLE), ("a shard", SHARD), ("partial sum", PARTIAL),
                        ("communication", COMM)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(color=color, size=12,
                                 symbol="diamond" if color == COMM else "square"), name=kind))
    fig.update_xaxes(visible=False, range=[-1.6, 8.6])
    fig.update_yaxes(visible=False, range=[-(tp - 1) * 1.3 - 0.8, 1.0])
    title = (f"One MLP on tp = {tp} ranks, {'with' if sequence_parallel else 'without'} sequence parallelism "
             f"(h = {h}, {tokens} tokens)")
    return plots.style(fig, title, height=160 + 95 * tp, legend="below")


def panel(S: Settings) -> Panel:
    controls = {"tp": W.SelectionSlider(options=options_with([2, 4, 8], max(S.worlds)), value=max(S.worlds),
                                        description="ranks tp", continuous_update=False,
                                        style={"description_width": "initial"}),
                "sequence_parallel": W.ToggleButtons(options=[("TP", False), ("TP + SP", True)], value=False,
                                                     description="split")}
    tokens = S.batch_size * S.block_size
    return Panel(lambda tp, sequence_parallel: figure(S.n_embd, tokens, tp, sequence_parallel), controls,
                 title="The split, drawn for this lesson's model")
