"""Lesson 04, section 1: the formats — bit layouts, range and precision, with an explorer panel."""

import math

import plotly.graph_objects as go
import torch

from labtools import plots
from labtools.claims import Findings, Ledger, at_most, is_true
from labtools.controls import number_box, parse_number
from labtools.precision import FORMATS, decompose
from labtools.widgets import Panel

COMMONLY_QUOTED = {  # the figures tables usually give: largest value and decimal digits
    "fp32": (3.4e38, 7), "bf16": (3.39e38, 3), "fp16": (65504.0, 3), "fp8_e4m3": (448.0, 1), "fp8_e5m2": (57344.0, 1),
}


def range_figure() -> go.Figure:
    """Each format's range on a log2 axis: subnormals (thin), normals (thick), and its gap after 1 (finfo's eps)."""
    fig = go.Figure()
    names = list(FORMATS)[::-1]
    for i, name in enumerate(names):
        f = FORMATS[name]
        lo, mid, hi = math.log2(f.min_subnormal), math.log2(f.min_normal), math.log2(f.max)
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=[lo, mid], y=[name, name], mode="lines", line=dict(color=c, width=4),
                                 showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[mid, hi], y=[name, name], mode="lines+text", line=dict(color=c, width=14),
                                 text=["", f"  max {f.max:.3g}, gap after 1: 2^{int(math.log2(f.eps))}"],
                                 textposition="middle right", showlegend=False, hoverinfo="skip"))
    fig.add_vline(x=0, line=dict(color="black", dash="dot"))
    plots.style(fig, "Range of each format (log₂ of magnitude; thin = subnormal)", "log₂ |x|", "")
    fig.update_xaxes(range=[-160, 200])
    return fig


def explorer_figure(x: float | str) -> go.Figure:
    x = parse_number(x, "x", finite=False)  # "1e400" is inf, as float("1e400") is: every format overflows
    rows = []
    for name in FORMATS:
        d = decompose(x, name)
        kind = "" if d.category == "normal" else f" ({d.category})"
        rows.append((name, d.bits, f"{d.stored:.10g}{kind}", f"{d.rel_error:.3g}"))
    return plots.table(["format", "sign exponent mantissa", "stored value", "relative error"], rows,
                       title=f"{x!r} in every format: the bits and the value they hold")


def explorer_panel() -> Panel:
    return Panel(explorer_figure, {"x": number_box(0.1, "x")}, debounce_ms=0,
                 title="Type a number")


def findings(ledger: Ledger) -> Findings:
    mismatched = [name for name, f in FORMATS.items() if f.dtype is not None and (f.max, f.min_normal, f.eps) != (
        torch.finfo(f.dtype).max, torch.finfo(f.dtype).smallest_normal, torch.finfo(f.dtype).eps)]
    ledger.add("finfo", "Every format's largest value, smallest normal and gap after 1, computed from its bit widths, "
               "equal PyTorch's own (formats that differ)", len(mismatched), at_most(0), kind="computed", detail=True)
    ledger.note("quoted_max", {name: FORMATS[name].max / largest - 1 for name, (largest, _) in COMMONLY_QUOTED.items()})
    one = decompose(1 + 2**-9, "bf16").stored
    ledger.add("bf16_one", "1 + 2⁻⁹ is stored as exactly 1 in bf16", one == 1.0, is_true(), kind="measured",
               detail=True)
    bf16, fp16 = FORMATS["bf16"], FORMATS["fp16"]
    table = ("| format | exponent / mantissa bits | largest | gap after 1 |\n|---|---|---|---|\n"
             + "\n".join(f"| {name} | {f.exp_bits} / {f.mantissa_bits} | {f.max:.6g} | "
                         f"$2^{{{int(math.log2(f.eps))}}}$ |"
                         for name, f in FORMATS.items()))
    return Findings([
        f"Range comes from exponent bits, precision from mantissa bits: bf16 has fp32's range with only "
        f"{bf16.mantissa_bits} mantissa bits, so $1 + 2^{{-9}}$ stored in bf16 is exactly **{one:g}**.",
        f"fp16 spends its bits the other way: {fp16.mantissa_bits} mantissa bits, but nothing above **{fp16.max:g}**.",
    ], [table, "Every value here is computed from the bit widths, and "
        + ("equals PyTorch's own." if not mismatched else f"differs from PyTorch's for {', '.join(mismatched)}.")])
