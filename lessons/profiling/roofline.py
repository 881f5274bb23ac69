"""Lesson 13, section 2: the roofline of this machine. Its compute roof (the best matrix-product rate) and memory
roof (STREAM's triad), and every aten op of one training step placed by its arithmetic intensity and the FLOP/s it
reached. The panel moves a block's ops with the model's width and the tokens per step, on this machine's roofs."""

import math

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, at_least
from labtools.device import pick_device
from labtools.widgets import Panel
from lessons.profiling import Settings, batch, gpt
from lessons.profiling.trace import COLORS

PLACED = ("matrix products", "attention", "normalisation", "element-wise", "other")


def run(S: Settings) -> dict:
    """The two roofs, measured; then one training step (forward, backward, AdamW) with every aten op timed alone."""
    dev = pick_device()
    peak = profiling.matmul_peak(S.matmul_sizes, dev, repeats=5)["fp32"]
    bw = profiling.bandwidth(S.stream_elems, dev)
    model = gpt(S)
    X, Y = batch(S)
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr)

    def step():
        model(X, Y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    ops = profiling.group(profiling.OpTimer.run(step, dev))
    return {"peak": peak["peak"], "by_size": peak["by_size"], "bandwidth": bw["triad"], "copy": bw["copy"],
            "ridge": profiling.ridge(peak["peak"], bw["triad"]), "ops": ops, "device": dev.type}


def _roof_trace(peak: float, bw: float, name: str, color: str, dash: str = "solid") -> go.Scatter:
    xs = np.logspace(-2, 4, 200)
    return go.Scatter(x=xs, y=[profiling.roof(x, peak, bw) for x in xs], mode="lines", name=name,
                      line=dict(color=color, width=3, dash=dash), hoverinfo="skip")


def figure(r: dict) -> go.Figure:
    """Log-log: intensity (FLOPs per byte) against achieved FLOP/s, the roofline of this machine over it; one point
    per op and shape, its area the time it took."""
    fig = go.Figure(_roof_trace(r["peak"], r["bandwidth"], "this machine's roofline (measured)", "black"))
    total = sum(g["seconds"] for g in r["ops"])
    for kind in PLACED:
        gs = [g for g in r["ops"] if g["kind"] == kind and g["flops"] > 0 and g["seconds"] > 0]
        if gs:
            fig.add_trace(go.Scatter(
                x=[g["intensity"] for g in gs], y=[g["flop_rate"] for g in gs], mode="markers", name=kind,
                marker=dict(color=COLORS[kind], size=[6 + 40 * math.sqrt(g["seconds"] / total) for g in gs],
                            line=dict(color="white", width=1), opacity=0.85),
                customdata=[[g["name"], g["shapes"], g["calls"], g["seconds"] * 1e3] for g in gs],
                hovertemplate="%{customdata[0]} (%{customdata[1]}), %{customdata[2]} calls, %{customdata[3]:.2f} ms"
                              "<br>%{x:.2f} FLOP/B, %{y:.3s}FLOP/s<extra></extra>"))
    plots.marked_line(fig, x=r["ridge"], text=f"ridge {r['ridge']:.1f} FLOP/B", log=True)
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOPs per byte moved)", exponentformat="SI")
    fig.update_yaxes(type="log", title_text="achieved FLOP/s", exponentformat="SI")
    plots.style(fig, f"Every op of one training step on this machine's roofline ({r['device']})", height=460,
                legend="below")
    return fig


# A block's ops, as the panel places them: FLOPs and bytes from the shapes (fp32 unless told), per step
def block_ops(d: int, tokens: int, b: int = 4) -> dict[str, tuple[float, float]]:
    """{op: (FLOPs, bytes)} of one transformer block's main ops at width d over `tokens` tokens, b bytes per element;
    the AdamW update of its 12·d² weights (about 12 FLOPs and 7 reads or writes of b bytes per weight)."""
    def mm(m, k, n):
        return 2 * m * k * n, b * (m * k + k * n + m * n)
    n = tokens * d
    return {"q, k, v projection": mm(tokens, d, 3 * d), "MLP up (d → 4d)": mm(tokens, d, 4 * d),
            "MLP down (4d → d)": mm(tokens, 4 * d, d), "layer norm": (8 * n, 2 * b * n),
            "GELU": (4 * n, 2 * b * 4 * n), "residual add": (n, 3 * b * n),
            "AdamW update": (12 * 12 * d * d, 7 * b * 12 * d * d)}


def _explorer(r: dict):
    def draw(width: int, tokens: int, precision: str) -> go.Figure:
        b = 2 if precision == "bf16" else 4
        fig = go.Figure(_roof_trace(r["peak"], r["bandwidth"], "this machine (fp32, measured)", "black"))
        fig.add_trace(_roof_trace(H100_BF16, H100_BW, "an H100 (bf16, published)", "#888888", "dash"))
        placed = [g for g in r["ops"] if g["flops"] > 0 and g["seconds"] > 0 and g["kind"] in PLACED]
        fig.add_trace(go.Scatter(x=[g["intensity"] for g in placed], y=[g["flop_rate"] for g in placed],
                                 mode="markers", name="section 2's ops (measured)",
                                 marker=dict(color="#cccccc", size=7), hoverinfo="skip"))
        points = _merged({name: f / by for name, (f, by) in block_ops(width, tokens, b).items()})
        xs = [x for _, x in points]
        fig.add_trace(go.Scatter(x=xs, y=[profiling.roof(x, r["peak"], r["bandwidth"]) for x in xs],
                                 mode="markers+text", text=[name for name, _ in points],
                                 textposition=["top center", "bottom center"] * len(points),
                                 name="a block's ops at this size (computed, on this machine's roof)",
                                 marker=dict(color=plots.color(3), size=12, symbol="diamond")))
        fig.update_xaxes(type="log", range=[-2, 4], title_text="arithmetic intensity (FLOPs per byte)",
                         exponentformat="SI")
        fig.update_yaxes(type="log", title_text="FLOP/s at most", exponentformat="SI")
        plots.style(fig, f"Width {width:,}, {tokens:,} tokens per step, {precision}", height=460, legend="below")
        return fig
    return draw


def _merged(intensity: dict[str, float]) -> list[tuple[str, float]]:
    """(label, intensity) in increasing order, ops within 15% of each other under one label (they would overlap)."""
    out: list[tuple[str, float]] = []
    for name, x in sorted(intensity.items(), key=lambda kv: kv[1]):
        if out and x <= out[-1][1] * 1.15:
            out[-1] = (f"{out[-1][0]} · {name}", out[-1][1])
        else:
            out.append((name, x))
    return out


H100_BF16 = 989e12  # NVIDIA H100 SXM datasheet: dense bf16 tensor-core FLOP/s
H100_BW = 3.35e12   # its HBM3 bandwidth, bytes/s


def panel(r: dict) -> Panel:
    style = {"description_width": "initial"}
    controls = {"width": W.SelectionSlider(options=[2**k for k in range(6, 15)], value=512, description="width d",
                                           continuous_update=False, style=style),
                "tokens": W.SelectionSlider(options=[2**k for k in range(4, 21)], value=1024,
                                            description="tokens per step", continuous_update=False, style=style),
                "precision": W.ToggleButtons(options=["fp32", "bf16"], value="fp32", description="precision")}
    return Panel(_explorer(r), controls, title="Move a block's ops: which stay memory-bound?")


def findings(ledger: Ledger, r: dict) -> Findings:
    ops = [g for g in r["ops"] if g["seconds"] > 0]
    mm = [g for g in ops if g["kind"] == "matrix products"]
    ew = [g for g in ops if g["kind"] == "element-wise" and g["flops"] > 0]
    mm_time = sum(g["seconds"] for g in mm)
    right = sum(g["seconds"] for g in mm if g["intensity"] > r["ridge"]) / mm_time
    mm_rate = sum(g["flops"] for g in mm) / mm_time
    ew_rate = sum(g["flops"] for g in ew) / sum(g["seconds"] for g in ew)
    ew_max = max(g["intensity"] for g in ew)
    best_mm = max(mm, key=lambda g: g["flop_rate"])
    ledger.add("matmul_compute_bound", "The step's matrix products lie right of the ridge: compute-bound (share "
               "of their time)", right, at_least(0.9), kind="measured")
    # no machine has a ridge below half a FLOP per byte, so "left of the ridge" cannot fail here: a note, not a claim
    ledger.note("elementwise_intensity_over_ridge", ew_max / r["ridge"])
    ledger.add("rates_apart", "Matrix products reach at least 10× the FLOP/s of element-wise ops (ratio of their "
               "rates over the step)", mm_rate / ew_rate, at_least(10), kind="measured")
    ledger.note("roofs", {"peak": r["peak"], "bandwidth": r["bandwidth"], "ridge": r["ridge"]})
    better = " (a shape the library handles better than square ones)" if best_mm["flop_rate"] > r["peak"] else ""
    return Findings([
        "Matrix products wait on arithmetic: all but a sliver of their time lies right of this machine's ridge. "
        f"Element-wise ops wait on memory: they do a fraction of a FLOP per byte and run **{mm_rate / ew_rate:.0f}×** "
        "slower per FLOP.",
    ], [
        f"This machine's roofs: {r['peak'] / 1e9:.0f} GFLOP/s for fp32 matrix products, {r['bandwidth'] / 1e9:.1f} "
        "GB/s from memory (STREAM's triad).",
        f"Matrix products: {right:.0%} of their time right of the ridge, at {mm_rate / r['peak']:.0%} of the peak.",
        f"The fastest matrix product ran at {best_mm['flop_rate'] / r['peak']:.0%} of the peak{better}.",
        f"Element-wise ops: at most {ew_max:.2f} FLOPs per byte.",
    ])
