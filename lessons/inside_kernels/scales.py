"""Lesson 22, section 4: FP8's two formats and four ways to scale a tensor. A tensor of normal values with one entry
set to a multiple of their typical size: the error every other entry takes under each scaling and format, against
the outlier's size; and real gradients of the GPT stored in FP8 with no scale at all."""

from dataclasses import dataclass

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch

from labtools import fp8, plots
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.controls import slider
from labtools.widgets import Panel
from lessons.inside_kernels import Settings

SHAPE = (256, 512)
OUTLIERS = tuple(10.0 ** e for e in range(0, 8))


def tensor(outlier: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Normal values, one entry set to `outlier` × their mean magnitude; and the mask of the other entries."""
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed))
    x[7, 100] = outlier * x.abs().mean()
    others = torch.ones_like(x, dtype=torch.bool)
    others[7, 100] = False
    return x, others


def error(outlier: float, scaling: fp8.Scaling, fmt: str = "e4m3", seed: int = 0) -> float:
    """Relative error of every entry but the outlier, after quantising the tensor with this scaling and format."""
    x, others = tensor(outlier, seed)
    return fp8.relative_error(fp8.qdq(x, scaling, fmt)[others], x[others])


@dataclass(frozen=True)
class Scales:
    errors: dict          # {(scaling name, format): [error at each of OUTLIERS]}
    underflow: dict       # {format: share of real gradient entries that become 0 stored without a scale}
    underflow_scaled: dict  # {format: the same share with a scale per group of 128}
    outlier: float


def run(S: Settings, grads: torch.Tensor) -> Scales:
    """grads: a flat tensor of real gradient entries (section 5's model, one batch)."""
    errors = {(name, fmt): [error(o, sc, fmt, S.seed) for o in OUTLIERS]
              for name, sc in fp8.SCALINGS.items() for fmt in fp8.FORMATS}
    nonzero = grads[grads != 0]
    tiles = nonzero[: nonzero.numel() // 128 * 128].reshape(-1, 128)
    under = {fmt: (fp8.unscaled(nonzero, fmt) == 0).float().mean().item() for fmt in fp8.FORMATS}
    scaled = {fmt: (fp8.qdq(tiles, fp8.TILES, fmt) == 0).float().mean().item() for fmt in fp8.FORMATS}
    return Scales(errors, under, scaled, S.outlier)


def breaks_at(sc: Scales, fmt: str = "e4m3") -> float | None:
    """The smallest outlier tried at which one scale for the whole tensor leaves the other entries more than 1.5×
    the error groups of 128 leave (None: at none of them)."""
    whole, tiles = sc.errors[("tensorwise", fmt)], sc.errors[("groups of 128", fmt)]
    return next((o for o, a, b in zip(OUTLIERS, whole, tiles) if a > 1.5 * b), None)


def _last_harmless(sc: Scales, fmt: str = "e4m3") -> float:
    """The largest outlier tried below the first that harmed the others (the largest tried, if none did)."""
    at = breaks_at(sc, fmt)
    return OUTLIERS[-1] if at is None else OUTLIERS[max(OUTLIERS.index(at) - 1, 0)]


def _power(x: float) -> str:
    return f"10{str(round(np.log10(x))).translate(str.maketrans('0123456789-', '⁰¹²³⁴⁵⁶⁷⁸⁹⁻'))}"


def figure(sc: Scales, fmt: str = "e4m3", mark: float | None = None) -> go.Figure:
    fig = go.Figure()
    for i, name in enumerate(fp8.SCALINGS):
        fig.add_trace(go.Scatter(x=list(OUTLIERS), y=sc.errors[(name, fmt)], name=f"{name}", mode="lines+markers",
                                 line=dict(color=plots.color(i))))
    if mark:
        plots.marked_line(fig, x=mark, text=f"outlier {_power(mark)}×", log=True)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    at = breaks_at(sc, fmt)
    said = (f"{fmt}: one scale for the whole tensor holds up to an outlier {_power(_last_harmless(sc, fmt))}× the "
            "rest; beyond, the others lose their precision" if at else
            f"{fmt}: one scale for the whole tensor holds at every outlier tried: its exponent range absorbs them")
    return plots.style(fig, said, "outlier ÷ typical magnitude",
                       "relative error of the other entries", height=400)


def panel(sc: Scales) -> Panel:
    def draw(fmt, log10_outlier):
        return figure(sc, fmt, 10.0 ** log10_outlier)
    return Panel(draw, {"fmt": W.ToggleButtons(options=list(fp8.FORMATS), value="e4m3", description="format"),
                        "log10_outlier": slider(5, 0, 7, 1, description="log₁₀ outlier")},
                 debounce_ms=0, title="Scaling × outlier size: which entries keep their precision?")


def findings(ledger: Ledger, sc: Scales) -> Findings:
    i = OUTLIERS.index(min(OUTLIERS, key=lambda o: abs(np.log10(o) - np.log10(sc.outlier))))
    small = OUTLIERS.index(1e3)
    e = {name: sc.errors[(name, "e4m3")] for name in fp8.SCALINGS}
    harm = e["tensorwise"][i] / e["groups of 128"][i]
    spread = max(v[small] for v in e.values()) / min(v[small] for v in e.values())
    ledger.add("outlier_harms_tensorwise", f"with one entry {_power(OUTLIERS[i])}× the rest, a single e4m3 scale "
               "leaves the other entries several times the error groups of 128 leave (ratio)", harm, at_least(3),
               kind="measured")
    ledger.add("exponent_absorbs", "an outlier 10³× the rest changes little: every scaling's error within 10% of the "
               "others' (largest ÷ smallest)", spread, at_most(1.1), kind="measured", detail=True)
    stated = {"e4m3": (448.0, 2.0 ** -6), "e5m2": (57344.0, None)}  # the formats table of the lesson's section 4
    differ = [f for f, (top, normal) in stated.items() if torch.finfo(fp8.FORMATS[f]).max != top
              or (normal is not None and torch.finfo(fp8.FORMATS[f]).smallest_normal != normal)]
    ledger.add("formats_as_torch", "the formats table's largest values and e4m3's smallest normal number are those of "
               "PyTorch's float8 types (formats that differ)", len(differ), at_most(0), kind="computed", detail=True)
    ledger.add("unscaled_underflow", "stored in e4m3 without a scale, a large share of the GPT's gradient entries "
               "become 0 (share)", sc.underflow["e4m3"], at_least(0.2), kind="measured")
    ledger.add("scaled_keeps", "with a scale per group of 128, almost no gradient entry becomes 0 in e4m3 (share)", sc.underflow_scaled["e4m3"],
               at_most(0.01), kind="measured", detail=True)
    rows = "".join(f"| {name} | " + " | ".join(f"{e[name][k]:.3f}" for k in (0, small, i)) + " |\n" for name in e)
    return Findings(
        ["FP8 is a floating-point format, so its exponent absorbs a large outlier: one e4m3 scale did no harm up to "
         f"{_power(_last_harmless(sc))}× the rest. Beyond, the others drop below e4m3's smallest normal number and "
         "lose bits; a scale per row or group keeps the harm to that row or group.",
         "Without any scale, real gradients lie below e4m3's range: "
         f"{sc.underflow['e4m3']:.0%} of the GPT's gradient entries became 0 in e4m3."],
        ["A 128 × 128 square shares its scale with far more entries than a group of 128 does, so an outlier harms more "
         "of them: the table's last row.",
         f"| e4m3, error of the other entries | no outlier | outlier 10³× | outlier {_power(OUTLIERS[i])}× |\n"
         f"|---|---|---|---|\n{rows}",
         "| gradient entries that become 0 | e4m3 | e5m2 |\n|---|---|---|\n"
         f"| no scale | {sc.underflow['e4m3']:.1%} | {sc.underflow['e5m2']:.1%} |\n"
         f"| a scale per group of 128 | {sc.underflow_scaled['e4m3']:.1%} | {sc.underflow_scaled['e5m2']:.1%} |"])
