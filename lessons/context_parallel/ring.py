"""Lesson 14, sections 1-3: ring attention on c real ranks, contiguous and zig-zag, against one process: who
computes which blocks, work and time per rank, bytes predicted, counted and on the wire, what each rank keeps."""

import functools

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most, between, is_true
from labtools.parallel import launch
from labtools.parallel.context import LAYOUTS, positions, predicted_bytes, predicted_saved, scores_per_rank
from labtools.widgets import Panel
from lessons.context_parallel import Settings, ranks


def run(S: Settings) -> dict:
    """One launch per context-parallel size; one process's saved bytes for comparison."""
    out = {c: launch(ranks.lesson_run, c, S, desc=f"context parallel × {c}", timeout_s=None) for c in S.worlds}
    return {"c": out, "one_process_saved": ranks.one_process_saved(S)}


def _blocks(fig: go.Figure, c: int, layout: str, axis: str) -> None:
    """The causal attention matrix cut into 2c × 2c blocks (query block × key block), each coloured by the rank
    that computes it; the blocks above the diagonal are masked, and nobody computes them."""
    n = 2 * c
    owner = {p: r for r in range(c) for p in positions(n, c, r, layout).tolist()}  # 2c positions: one per block
    z = np.full((n, n), np.nan)  # numpy, not nested lists: plotly validates it at once (the panel redraws c = 16)
    for i in range(n):
        z[i, :i + 1] = owner[i]
    labels = dict(text=np.where(np.isnan(z), "", np.nan_to_num(z).astype(int).astype(str)), texttemplate="%{text}") \
        if c <= 4 else {}
    fig.add_trace(go.Heatmap(z=z, **labels, zmin=0, zmax=c - 1, showscale=False,
                             colorscale=[[k / max(c - 1, 1), plots.color(k)] for k in range(c)],
                             hovertemplate="query block %{y}, key block %{x}: rank %{z}<extra></extra>",
                             xgap=1, ygap=1, xaxis=f"x{axis}", yaxis=f"y{axis}"))


@functools.cache
def _layout_grid() -> go.Layout:
    """The three panes' layout, made once: make_subplots alone costs more than a redraw may take."""
    fig = plots.subplots(1, 3, ["contiguous: rank of each block", "zig-zag: rank of each block",
                                "score entries per rank"], height=380, title="Causal attention",
                         horizontal_spacing=0.08)  # a title, so room is left above the panes
    for col in (1, 2):
        fig.update_yaxes(autorange="reversed", title_text="query block" if col == 1 else None, row=1, col=col)
        fig.update_xaxes(title_text="key block", row=1, col=col)
    fig.update_xaxes(title_text="rank", row=1, col=3)
    fig.update_yaxes(title_text="÷ the busiest rank", range=[0, 1.05], row=1, col=3)
    fig.update_layout(barmode="group")
    return fig.layout


def layout_figure(c: int, s: int | None = None) -> go.Figure:
    """Who computes which blocks of causal attention on c ranks, contiguous and zig-zag, and the score entries
    each rank computes (labtools.parallel.context.scores_per_rank, what ring_attention counts when it runs)."""
    s = s or 2 * c * 64
    fig = go.Figure(layout=_layout_grid())
    fig.update_layout(title=f"Causal attention on c = {c} ranks")
    for col, layout in enumerate(LAYOUTS, 1):
        _blocks(fig, c, layout, "" if col == 1 else str(col))
        work = scores_per_rank(s, c, layout)
        fig.add_trace(go.Bar(x=list(range(c)), y=[w / max(work) for w in work], name=layout,
                             marker_color=["#444444", "#bbbbbb"][col - 1], xaxis="x3", yaxis="y3"))
    return fig


def layout_panel(S: Settings) -> Panel:
    control = W.SelectionSlider(options=[2, 4, 8, 16], value=max(S.worlds), description="ranks c",
                                continuous_update=False, style={"description_width": "initial"})
    return Panel(lambda c: layout_figure(c), {"c": control}, title="Split the sequence over more ranks")


def balance_figure(r: dict, S: Settings) -> go.Figure:
    """Per rank at the largest c: score entries computed (counted) and forward seconds (measured, each rank's work in
    turn in one process), each as a share of the busiest rank's, contiguous and zig-zag."""
    c = max(S.worlds)
    res = r["c"][c]
    fig = plots.subplots(1, 2, ["score entries computed (counted)", "forward time of each rank's work (measured)"],
                         height=340, title=f"Work per rank, c = {c}: contiguous vs zig-zag")
    for i, layout in enumerate(LAYOUTS):
        for col, key in ((1, "scores"), (2, "compute_s")):
            vals = [x["layouts"][layout][key] for x in res]
            fig.add_trace(go.Bar(x=[f"rank {x['rank']}" for x in res], y=[v / max(vals) for v in vals], name=layout,
                                 marker_color=plots.color(i), showlegend=col == 1, offsetgroup=layout),
                          row=1, col=col)
    fig.update_yaxes(title_text="÷ the busiest rank", range=[0, 1.05])
    fig.update_layout(barmode="group")
    return fig


def bytes_table(r: dict, S: Settings) -> go.Figure:
    rows = []
    for c, res in r["c"].items():
        pred = predicted_bytes(1, S.heads, S.seq, S.head_dim, c)
        for layout in LAYOUTS:
            counted = sum(x["layouts"][layout]["bytes"] for x in res)
            wire = res[0]["layouts"][layout]["wire"]
            rows.append([c, layout, f"{pred * c:,}", f"{counted:,}", "—" if wire is None else f"{wire:,}"])
    return plots.table(["c", "layout", "predicted, c ranks × 2(c−1)·2b(s/c)h·4", "counted at the sends",
                        "on the wire (loopback)"], rows, title="Bytes all ranks sent, one forward and backward")


def _ratio(vals: list[float]) -> float:
    return max(vals) / min(vals)


def parity_findings(ledger: Ledger, r: dict, S: Settings) -> Findings:
    parts = []
    for c, res in r["c"].items():
        diff = max(x["layouts"][layout]["max_diff"] for x in res for layout in LAYOUTS)
        ledger.add(f"parity_{c}", f"c = {c}: ring attention's output and gradients equal one process's, both layouts "
                   "(largest |difference|)", diff, at_most(1e-5), kind="measured")
        pred = predicted_bytes(1, S.heads, S.seq, S.head_dim, c)
        counted = [x["layouts"][layout]["bytes"] for x in res for layout in LAYOUTS]
        ledger.add(f"bytes_counted_{c}", f"c = {c}: each rank sent 2(c−1) key/value blocks (bytes counted at the "
                   "sends, every rank and layout, = the formula)", all(b == pred for b in counted), is_true(),
                   kind="counted", detail=True)
        wire = res[0]["layouts"]["zigzag"]["wire"]
        if wire is not None:
            ledger.add(f"wire_{c}", f"c = {c}: bytes on the wire ÷ the prediction for all ranks (headers and the "
                       "positions that travel with each block add a little)", wire / (pred * c), between(1.0, 1.3),
                       kind="measured")
        parts.append(f"**c = {c}: the same attention as one process** to {diff:.0e}, output and gradients; each rank "
                     f"sent {pred:,} bytes" + ("" if wire is None else f", {wire / (pred * c):.2f}× that on the wire")
                     + ".")
    return Findings(parts)


def balance_findings(ledger: Ledger, r: dict, S: Settings, redraw_ms: float) -> Findings:
    ledger.add("layout_panel_fast", "The layout panel redraws in ≤ 100 ms (median)", redraw_ms, at_most(100),
               kind="measured", detail=True)
    c = max(S.worlds)
    res = r["c"][c]
    work = {layout: _ratio([x["layouts"][layout]["scores"] for x in res]) for layout in LAYOUTS}
    time = {layout: _ratio([x["layouts"][layout]["compute_s"] for x in res]) for layout in LAYOUTS}
    ledger.add("work_contiguous", f"c = {c}, contiguous: the last rank computes c times the first's score entries "
               "(busiest ÷ least busy)", work["contiguous"], approx(c, abs=1e-9), kind="counted")
    ledger.add("work_zigzag", f"c = {c}, zig-zag: every rank computes the same (busiest ÷ least busy)", work["zigzag"],
               approx(1.0, abs=1e-9), kind="counted")
    ledger.add("time_zigzag", f"c = {c}, zig-zag: the ranks' forward times within 30% of each other (busiest ÷ "
               "least busy; each rank's work timed in turn in one process, best of rounds)", time["zigzag"],
               at_most(1.3), kind="measured")
    ledger.add("time_contiguous", f"c = {c}, contiguous: the busiest rank's forward takes at least 1.5× the least "
               "busy one's (less than the c× of its scores: every block also has costs that do not shrink with it)",
               time["contiguous"], at_least(1.5), kind="measured")
    slowest = {layout: max(x["layouts"][layout]["compute_s"] for x in res) for layout in LAYOUTS}
    gain = slowest["contiguous"] / slowest["zigzag"]
    ledger.note("zigzag_gain", gain)
    return Findings([
        f"**Contiguous, c = {c}: the last rank computes {work['contiguous']:.0f}× the first's scores** and takes "
        f"{time['contiguous']:.1f}× its time: each block also costs what does not shrink with it (allocation, the "
        "merge).",
        f"**Zig-zag: {work['zigzag']:.2f}× in scores, {time['zigzag']:.2f}× in time**: every rank holds one early "
        "and one late block.",
        f"**The step waits for the busiest rank: zig-zag's takes {1 / gain:.2f}× contiguous's time.** Its blocks are "
        "half the size and twice as many: where they are small, their fixed costs eat the gain (compare `smoke` "
        "with `cpu`).",
    ])


def memory_findings(ledger: Ledger, r: dict, S: Settings) -> Findings:
    c = max(S.worlds)
    res = r["c"][c]
    one = r["one_process_saved"]
    kept = {layout: max(x["layouts"][layout]["saved"] for x in res) / one for layout in LAYOUTS}
    ledger.add("memory_split", f"c = {c}: the busiest rank keeps at most 1.5/c of what one process keeps for "
               "backward (contiguous; ratio)", kept["contiguous"], at_most(1.5 / c), kind="measured")
    for layout in LAYOUTS:
        worst = max(x["layouts"][layout]["saved"] / predicted_saved(x["layouts"][layout]["scores"], S.heads)
                    for x in res)
        ledger.add(f"memory_predicted_{layout}", f"c = {c}, {layout}: each rank keeps the 2·a·4 bytes per score "
                   "entry it computed, plus less than as much again in blocks received, log-sum-exps and masks "
                   "(largest measured ÷ predicted)", worst, between(1.0, 1.6), kind="measured")
    parts = [
        f"**Memory: the busiest rank keeps {kept['contiguous']:.2f} (contiguous) and {kept['zigzag']:.2f} (zig-zag) "
        f"of one process's {one / 2**20:.1f} MiB** for backward.",
    ]
    cp = res[0]["torch_cp"]
    parts.append(f"**torch's context_parallel ran here** and matched one process to {cp['max_diff']:.0e}."
                 if cp["ran"] else f"**torch's context_parallel did not run here**: {cp['error'].rstrip('.')}.")
    ledger.note("torch_cp", cp)
    return Findings(parts)
