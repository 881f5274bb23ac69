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


def table() -> go.Figure:
    rows = []
    for name, f in FORMATS.items():
        fi = torch.finfo(f.dtype) if f.dtype is not None else None
        agrees = "—" if fi is None else ("yes" if (f.max, f.min_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)
                                         else "NO")
        rows.append((name, f"1 / {f.exp_bits} / {f.mantissa_bits}", f"{f.max:.6g}", f"{f.min_normal:.3g}",
                     f"{f.min_subnormal:.3g}", f"{f.eps:.3g}", f"{f.decimal_digits:.1f}", agrees))
    return plots.table(["format", "sign / exp / mantissa bits", "largest", "smallest normal", "smallest subnormal",
                        "gap after 1 (finfo's eps)", "decimal digits", "= torch.finfo"], rows,
                       title="Formats, computed from their bit widths")


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
        rows.append((name, d.bits, f"{d.stored:.10g}", d.category, f"{d.abs_error:.3g}", f"{d.rel_error:.3g}"))
    return plots.table(["format", "sign exponent mantissa", "stored value", "kind", "abs error", "rel error"], rows,
                       title=f"{x!r} in every format")


def explorer_panel() -> Panel:
    return Panel(explorer_figure, {"x": number_box(0.1, "x")}, debounce_ms=0,
                 title="Type a number")


def findings(ledger: Ledger) -> Findings:
    mismatched = [name for name, f in FORMATS.items() if f.dtype is not None and (f.max, f.min_normal, f.eps) != (
        torch.finfo(f.dtype).max, torch.finfo(f.dtype).smallest_normal, torch.finfo(f.dtype).eps)]
    ledger.add("finfo", "Every format's largest value, smallest normal and gap after 1, computed from its bit widths, "
               "equal torch.finfo's (formats that differ)", len(mismatched), at_most(0), kind="computed", detail=True)
    worst = max(abs(FORMATS[name].max / largest - 1) for name, (largest, _) in COMMONLY_QUOTED.items())
    quoted = ", ".join(f"{name} {largest:g}" for name, (largest, _) in COMMONLY_QUOTED.items())
    ledger.add("quoted_max", f"The commonly quoted largest values ({quoted}) are what the bit widths give (worst "
               "relative gap)", worst, at_most(0.01), source="common tables", kind="computed", detail=True)
    one = decompose(1 + 2**-9, "bf16").stored
    ledger.add("bf16_one", "1 + 2⁻⁹ is stored as exactly 1 in bf16", one == 1.0, is_true(), kind="measured")
    bf16, fp16 = FORMATS["bf16"], FORMATS["fp16"]
    return Findings([
        f"Range comes from exponent bits, precision from mantissa bits: bf16 has fp32's range with only "
        f"{bf16.mantissa_bits} mantissa bits, so $1 + 2^{{-9}}$ stored in bf16 is exactly **{one:g}**.",
        f"fp16 spends its bits the other way: {fp16.mantissa_bits} mantissa bits, but nothing above **{fp16.max:g}**.",
    ], [f"Every format's largest value, smallest normal and gap after 1, computed from its bit widths, equal "
        f"torch.finfo's{'' if not mismatched else ' except ' + ', '.join(mismatched)}."])
