"""Plotly figure builders. Each takes plain data (Histories, dicts of columns) and returns a go.Figure.

    style(fig, title, xaxis, yaxis)    the lab's look for any figure (template, margins, legend below)
    subplots(rows, cols, titles)       make_subplots, styled
    loss_curves, lines, bars, table    common figures
    timeline(intervals)                a Gantt chart: what each rank did when (pipeline schedules)
"""

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

if TYPE_CHECKING:  # only for the annotation: plots sits below train in the import order
    from labtools.train import History

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")

# The look of plotly_white with only what our figures use. plotly validates and copies a figure's whole
# template on every build; plotly_white styles every trace type and costs ~8 ms a figure, this ~0.5 ms,
# which matters for panels that must redraw in <= 100 ms. Registered under a name (no default changed).
_GRID = "#EBF0F8"
pio.templates["labtools"] = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", colorway=list(COLORS), font=dict(color="#2a3f5f"),
    title=dict(x=0.05, font=dict(size=15)), hovermode="closest",
    xaxis=dict(gridcolor=_GRID, linecolor=_GRID, zerolinecolor=_GRID, zerolinewidth=2, automargin=True),
    yaxis=dict(gridcolor=_GRID, linecolor=_GRID, zerolinecolor=_GRID, zerolinewidth=2, automargin=True),
))
TEMPLATE = "labtools"


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


LEGENDS = {"below": dict(orientation="h", y=-0.2), "right": dict(orientation="v"), "top": dict(orientation="h",
                                                                                                y=1.12)}


TITLE_CHARS = 70  # a line of the 15-px title fits the 592-px output area of a 1024-px JupyterLab, sidebar open


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """The title broken into lines of at most `width` visible characters (at spaces; HTML tags are not counted;
    its own <br> kept): plotly never wraps a title, and cuts it at the figure's edge."""
    lines = []
    for part in re.split(r"<br\s*/?>", title):
        line, seen = "", 0
        for word in part.split(" "):
            n = len(re.sub(r"<[^>]+>", "", word))
            if line and seen + 1 + n > width:
                lines.append(line)
                line, seen = word, n
            else:
                line, seen = (f"{line} {word}", seen + 1 + n) if line else (word, n)
        lines.append(line)
    return "<br>".join(lines)


LINE_PX = 22  # the height one more line of a wrapped title takes


def title_room(title: str) -> int:
    """The extra pixels of top margin (and height) a wrapped title's lines past the first need."""
    return LINE_PX * title.count("<br>")


def style(fig: go.Figure, title: str | None = None, xaxis: str | None = None, yaxis: str | None = None, *,
          height: int = 380, legend: str | dict = "below", **layout) -> go.Figure:
    """Apply the lab's look: template, margins, height, legend placement ("below", "right", "top", or a plotly
    legend dict); any other layout keyword passes through (barmode="stack", …). A long title is wrapped
    (wrap_title) and the top margin grows with its lines. Returns the figure."""
    if isinstance(legend, str) and legend not in LEGENDS:
        raise ValueError(f"legend must be one of {tuple(LEGENDS)} or a dict, got {legend!r}")
    kw = dict(template=TEMPLATE, height=height, margin=dict(l=60, r=20, t=50, b=50),
              legend=LEGENDS[legend] if isinstance(legend, str) else legend)
    if title is not None:
        title = wrap_title(title)
        kw["title"] = title
        kw["margin"]["t"] += title_room(title)
        kw["height"] = height + title_room(title)
    if xaxis is not None:
        kw["xaxis_title"] = xaxis
    if yaxis is not None:
        kw["yaxis_title"] = yaxis
    fig.update_layout(**kw, **layout)
    return fig


def subplots(rows: int, cols: int, titles: Sequence[str] = (), *, title: str | None = None, height: int = 380,
             legend: str | dict = "below", **kw) -> go.Figure:
    """make_subplots with the lab's look; kw goes to make_subplots (shared_yaxes, specs, …)."""
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(titles) or None, **kw)
    style(fig, title, height=height, legend=legend)
    if title and titles:  # room for the figure's title above the subplots' own
        extra = title_room(fig.layout.title.text)
        fig.update_layout(margin_t=90 + extra, height=height + 40 + extra)
    return fig


def marked_line(fig: go.Figure, *, x: float | None = None, y: float | None = None, text: str = "", log: bool = False,
                end: str = "high", row: int | None = None, col: int | None = None, line: dict | None = None,
                **annotation) -> go.Figure:
    """A vertical (x=) or horizontal (y=) line with its label, also on a log axis: there plotly reads an annotation's
    position as log10 of the value, and add_vline/add_hline(annotation_text=...) pass the value itself, which puts
    the label at 10^value (off the chart). `log`: the line's axis is logarithmic; `end`: the label at the line's
    "high" end (top, right) or "low" end (bottom, left)."""
    if end not in ("high", "low"):
        raise ValueError(f"end must be 'high' or 'low', got {end!r}")
    if (x is None) == (y is None):
        raise ValueError("give exactly one of x (a vertical line) or y (a horizontal line)")
    line = dict(color="black", dash="dash") | (line or {})
    if x is not None:
        fig.add_vline(x=x, line=line, row=row, col=col)
    else:
        fig.add_hline(y=y, line=line, row=row, col=col)
    if text:
        at = math.log10(x if x is not None else y) if log else (x if x is not None else y)
        high = end == "high"
        where = (dict(x=at, y=1.0 if high else 0.0, yref="y domain", yanchor="top" if high else "bottom",
                      xanchor="left") if x is not None else
                 dict(x=1.0 if high else 0.0, y=at, xref="x domain", xanchor="right" if high else "left",
                      yanchor="bottom"))
        fig.add_annotation(text=text, showarrow=False, row=row, col=col, **(where | annotation))
    return fig


def loss_curves(runs: Mapping[str, "History"], *, floor: float | None = None, floor_label: str = "entropy floor",
                train: bool = True, val: bool = True, title: str = "Loss", log_y: bool = False) -> go.Figure:
    """Training loss (thin) and validation loss (markers) per run, one color each; optional floor line."""
    fig = go.Figure()
    for i, (name, h) in enumerate(runs.items()):
        if train:
            fig.add_trace(go.Scatter(x=h.step, y=h.loss, mode="lines", name=f"{name} · train",
                                     line=dict(color=color(i), width=1), opacity=0.45, legendgroup=name))
        if val:
            fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=f"{name} · val",
                                     line=dict(color=color(i), width=2), marker=dict(size=5), legendgroup=name))
    if floor is not None:
        fig.add_hline(y=floor, line=dict(color="black", dash="dash", width=1),
                      annotation_text=f"{floor_label} {floor:.3f}", annotation_position="top right")
    style(fig, title, "step", "loss (nats/token)")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def lines(x: Sequence, ys: Mapping[str, Sequence], *, title: str = "", xaxis: str = "", yaxis: str = "",
          log_x: bool = False, log_y: bool = False, mode: str = "lines") -> go.Figure:
    """One line per entry of ys over a shared x."""
    fig = go.Figure([go.Scatter(x=list(x), y=list(y), mode=mode, name=name, line=dict(color=color(i)))
                     for i, (name, y) in enumerate(ys.items())])
    style(fig, title, xaxis, yaxis)
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def bars(categories: Sequence[str], values: Mapping[str, Sequence[float]], *, title: str = "", yaxis: str = "",
         stacked: bool = False, text: bool = True) -> go.Figure:
    """Grouped (or stacked) bars: one series per entry of values over shared categories."""
    fig = go.Figure([go.Bar(x=list(categories), y=list(v), name=name, marker_color=color(i),
                            texttemplate="%{y:.3g}" if text else None)
                     for i, (name, v) in enumerate(values.items())])
    style(fig, title, "", yaxis, barmode="stack" if stacked else "group")
    return fig


def shares(named: Mapping[str, "Interval"], *, title: str, yaxis: str, height: int = 360) -> go.Figure:
    """One bar per share (exact answers, in %), each with its interval (labtools.evidence.share)."""
    fig = go.Figure()
    for i, (name, s) in enumerate(named.items()):
        fig.add_trace(go.Bar(x=[name], y=[100 * s.estimate], marker_color=color(i), showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[100 * (s.high - s.estimate)],
                                          arrayminus=[100 * (s.estimate - s.low)]),
                             texttemplate=f"{100 * s.estimate:.0f}%", textposition="inside",
                             hovertemplate=f"{name}: {100 * s.estimate:.1f}% [{100 * s.low:.1f}, "
                                           f"{100 * s.high:.1f}]<extra></extra>"))
    fig.update_yaxes(range=[0, 100])
    return style(fig, title, "", yaxis, height=height)


def table(header: Sequence[str], rows: Sequence[Sequence], *, title: str = "", row_height: int = 28) -> go.Figure:
    """A plotly table (used where a small table reads better than a chart); raise row_height for wrapped cells."""
    cols = list(zip(*rows)) if rows else [[] for _ in header]
    fig = go.Figure(go.Table(header=dict(values=list(header), align="left", fill_color="#eef"),
                             cells=dict(values=cols, align="left", height=row_height)))
    title = wrap_title(title)
    extra = title_room(title)
    fig.update_layout(template=TEMPLATE, title=title, margin=dict(l=10, r=10, t=(40 if title else 10) + extra, b=10),
                      height=(70 if title else 30) + extra + row_height * (len(rows) + 1) + 20)
    return fig


# Colors of a timeline's kinds of work: forward blue, backward orange-red; others cycle the palette.
TIMELINE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "backward_input": "#ffbb78",
                   "backward_weight": "#d62728", "send": "#9467bd", "recv": "#8c564b", "idle": "#e5e5e5"}
TIMELINE_NAMES = {"forward": "forward (F)", "backward": "backward (B)", "backward_input": "input gradient (I)",
                  "backward_weight": "weight gradient (W)"}  # a kind's name in the legend


def timeline(intervals: Sequence[Mapping], *, title: str = "", unit: str = "ms", row_label: str = "rank",
             height: int | None = None) -> go.Figure:
    """A Gantt chart: one row per `row`, one bar per interval {row, kind, start, end, label?, stage?}, colored by kind.

    start/end are in `unit` from a common origin. Rows read top to bottom (rank 0 on top); each kind is one
    legend entry; hovering a bar shows its label (and stage), start and end; a label too wide for its bar is hidden.
    """
    rows = sorted({iv["row"] for iv in intervals})
    kinds = list(dict.fromkeys(iv["kind"] for iv in intervals))
    fig = go.Figure()
    staged = all("stage" in iv for iv in intervals)  # pipeline actions: the hover names the stage too
    for i, kind in enumerate(kinds):
        ivs = [iv for iv in intervals if iv["kind"] == kind]
        fig.add_trace(go.Bar(
            y=[f"{row_label} {iv['row']}" for iv in ivs], x=[iv["end"] - iv["start"] for iv in ivs],
            base=[iv["start"] for iv in ivs], orientation="h", name=TIMELINE_NAMES.get(kind, kind),
            marker=dict(color=TIMELINE_COLORS.get(kind, color(i + 2)), line=dict(color="white", width=0.5)),
            text=[str(iv.get("label", "")) for iv in ivs], textposition="inside", insidetextanchor="middle",
            textangle=0, customdata=[iv.get("stage") for iv in ivs],
            hovertemplate="%{text}" + (", stage %{customdata}" if staged else "") + ": %{base:.2f} → %{x:.2f} "
            + unit + "<extra>" + kind + "</extra>"))
    style(fig, title, unit, None, height=height or 120 + 45 * len(rows), barmode="overlay",
          uniformtext=dict(minsize=8, mode="hide"))  # a label too wide for its bar is left to the hover text
    fig.update_yaxes(categoryorder="array", categoryarray=[f"{row_label} {r}" for r in reversed(rows)])
    return fig
