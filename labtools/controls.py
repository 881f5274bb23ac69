"""Controls a panel is built from: sliders that start at the value the notebook ran with, a slider over round
values, a box for a typed number and its parser, which names a bad value instead of changing it."""

import math
from collections.abc import Sequence

import ipywidgets as W


def options_with(options, value) -> list:
    """The options with `value` among them (sorted in), so a selection control can start at any value the
    notebook ran with instead of silently snapping to a neighbour."""
    return sorted(set(options) | {value})


def slider(value, lo, hi, step=None, description: str = "", log: bool = False, continuous: bool = True,
           **kw) -> W.ValueWidget:
    """A labelled slider: int or float from the type of `value`; log=True for a log-scale float slider.

    The range is widened to include `value`, so a panel always starts at the configuration the notebook ran
    (ipywidgets would clamp it, or fail when lo > hi). continuous=False redraws only on release: use it where
    a change starts a training run.
    """
    lo, hi = min(lo, value), max(hi, value)
    style = {"description_width": "initial"}
    common = dict(description=description, style=style, continuous_update=continuous, **kw)
    if log:
        return W.FloatLogSlider(value=value, base=10, min=math.log10(lo), max=math.log10(hi),
                                step=step or 0.1, **common)
    if isinstance(value, int) and not isinstance(value, bool):
        return W.IntSlider(value=value, min=lo, max=hi, step=step or 1, **common)
    return W.FloatSlider(value=value, min=lo, max=hi, step=step or (hi - lo) / 100, **common)


def nice_values(lo: float, hi: float, include: Sequence[float] = (), steps=(1, 1.5, 2, 3, 5, 7)) -> list[float]:
    """Round values from lo to hi, a few per decade (1, 1.5, 2, 3, 5, 7 × 10^k), with the lesson's own values
    (`include`: GPT-3's 175 B, a measured save time) sorted in: a slider over them lands on each exactly."""
    out = set(float(x) for x in include)
    for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in steps:
            v = float(f"{m * 10.0**k:.6g}")
            if lo <= v <= hi:
                out.add(v)
    return sorted(out)


def label(x: float) -> str:
    """A value as a learner reads it: 175, 15,600, 0.003, 3e-05."""
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e7):
        return f"{x:.3g}"
    return f"{x:,.6g}" if abs(x) >= 1000 else f"{x:.6g}"


def choice_slider(value: float, lo: float, hi: float, description: str, include: Sequence[float] = (),
                  continuous: bool = True) -> W.SelectionSlider:
    """A slider over nice_values(lo, hi) and the lesson's own values, starting at `value` exactly, its readout the
    value as written (175, not 174.98): for log-scale quantities where a 0.1-decade step would miss them."""
    options = nice_values(lo, hi, [value, *include])
    return W.SelectionSlider(options=[(label(v), v) for v in options], value=float(value), description=description,
                             continuous_update=continuous, style={"description_width": "initial"})


def parse_number(text, name: str, *, integer: bool = False, lo: float | None = None, hi: float | None = None,
                 finite: bool = True) -> float:
    """A number typed in a box, or a ValueError that names the box as the learner sees it: "3.5" and "1e9" are
    what they say; "abc", "1,5", "1e400" and, for a whole number, "3.5" are refused, never silently changed."""
    s = str(text).strip().replace("_", "")
    kind = "a whole number" if integer else "a number"
    if "," in s:
        raise ValueError(f"{name}: write {kind} without commas, got {text!r}")
    try:
        x = float(s)
    except ValueError:
        raise ValueError(f"{name}: {kind} is needed, got {text!r}") from None
    if finite and not math.isfinite(x):
        raise ValueError(f"{name}: a finite number is needed, got {text!r}")
    if integer and x != int(x):
        raise ValueError(f"{name}: a whole number is needed, got {text!r}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ValueError(f"{name} must be in [{label(lo) if lo is not None else '-inf'}, "
                         f"{label(hi) if hi is not None else 'inf'}], got {text!r}")
    return int(x) if integer else x


def number_box(value: float, description: str) -> W.Text:
    """A box for a typed number: the draw function parses it with parse_number, so bad input is named, not
    changed."""
    return W.Text(value=label(value).replace(",", ""), description=description,
                  style={"description_width": "initial"}, continuous_update=False)
