"""Control panels: ipywidgets controls bound to a function that draws a plotly figure.

    panel = Panel(draw, {"depth": IntSlider(...), "width": IntSlider(...)})
    panel.show()

`draw(**values) -> go.Figure` is called with the controls' current values; its traces and
layout are copied into one FigureWidget, so the figure updates in place. Changes are
debounced: while a slider is being dragged, only the last value within `debounce_ms` draws.
Without a frontend (papermill, `make book`, LABTOOLS_STATIC=1) `show()` draws the default
values once as a static figure, so the notebook still shows something useful.

Training-driven panels wrap their experiment in `RunCache`, so a setting seen before answers
at once and a new one runs (with a progress bar) and is kept.
"""

import asyncio
import html
import inspect
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from labtools.progress import bars_into, has_frontend


class Panel:

    def __init__(self, draw: Callable[..., go.Figure], controls: Mapping[str, W.ValueWidget], *,
                 debounce_ms: int = 120, title: str = ""):
        self.draw = draw
        self.controls = dict(controls)
        self.debounce_ms = debounce_ms
        self.title = title
        self.status = W.HTML()
        self.output = W.Output()  # progress bars of a redraw (e.g. a training run) appear here
        self.draw_ms: list[float] = []  # kernel-side time of each redraw
        self._figure: go.FigureWidget | None = None
        self._pending = None
        for control in self.controls.values():
            control.observe(self._on_change, names="value")

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    @property
    def figure(self) -> go.FigureWidget | go.Figure:
        """The live figure (created and drawn on first use). Without a frontend it is a plain go.Figure updated
        the same way: a FigureWidget nobody sees would still be saved, plotly.js and all, in the notebook."""
        if self._figure is None:
            self.redraw()
        return self._figure

    def redraw(self) -> None:
        """Draw with the current values now, updating the FigureWidget in place."""
        t0 = time.perf_counter()
        self.output.outputs = ()  # drop the previous draw's bars
        try:
            with bars_into(self.output.append_display_data):
                new = self.draw(**self.values())
        except Exception as e:  # shown in the panel: a callback's traceback would only reach the server log
            self.status.value = (f"<span class='lab-panel-error' style='color:#cf222e'>"
                                 f"{html.escape(f'{type(e).__name__}: {e}')}</span>")
            return
        if self._figure is None:
            self._figure = go.FigureWidget() if has_frontend() else go.Figure()
        fig = self._figure
        with fig.batch_update():
            same_shape = len(fig.data) == len(new.data) and all(
                a.type == b.type for a, b in zip(fig.data, new.data))
            if same_shape:
                for old, trace in zip(fig.data, new.data):
                    old.update(trace.to_plotly_json(), overwrite=True)
            else:
                fig.data = ()
                fig.add_traces(list(new.data))
            fig.layout = new.layout
        ms = (time.perf_counter() - t0) * 1e3
        self.draw_ms.append(ms)
        self.status.value = f"<small style='color:#666'>redrawn in {ms:.0f} ms</small>"

    def _on_change(self, change) -> None:
        if self.debounce_ms <= 0:
            self.redraw()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a plain script): draw at once
            self.redraw()
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self.debounce_ms / 1e3, self.redraw)

    def time_redraw(self, control: str, values: list, repeats: int = 3) -> float:
        """Median kernel-side redraw time in ms while `control` steps through `values` (no debounce)."""
        _ = self.figure
        saved, self.debounce_ms = self.debounce_ms, 0
        start = len(self.draw_ms)
        original = self.controls[control].value
        for _ in range(repeats):
            for v in values:
                self.controls[control].value = v
        self.controls[control].value = original
        self.debounce_ms = saved
        return statistics.median(self.draw_ms[start:])

    def widget(self) -> W.Widget:
        header = [W.HTML(f"<b>{self.title}</b>")] if self.title else []
        controls = W.HBox(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap"))
        box = W.VBox(header + [controls, self.output, self.figure, self.status])
        box.add_class("lab-panel")  # how a browser test finds each panel, its controls and its figure
        return box

    def show(self) -> None:
        """The live panel with a frontend; otherwise the figure for the default values."""
        if has_frontend():
            display(self.widget())
            return
        values = ", ".join(f"{k}={v!r}" for k, v in self.values().items())
        display({"text/markdown": f"*{self.title + ' — ' if self.title else ''}static view for {values}; "
                                  "open the notebook in JupyterLab to move the controls.*"}, raw=True)
        self.draw(**self.values()).show()


class RunCache:
    """Memoise an expensive function of keyword primitives: fn(**config) runs once per config."""

    def __init__(self, fn: Callable[..., object]):
        self.fn = fn
        self.store: dict[str, object] = {}

    @staticmethod
    def key(config: Mapping) -> str:
        return json.dumps(dict(config), sort_keys=True, default=str)

    def __call__(self, **config):
        k = self.key(config)
        if k not in self.store:
            self.store[k] = self.fn(**config)
        return self.store[k]

    def __contains__(self, config: Mapping) -> bool:
        return self.key(config) in self.store

    def __len__(self) -> int:
        return len(self.store)


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


def answer_check(expected: Mapping[str, float], rel: float = 0.01, unit: str = ""):
    """An Exercise check: every answer within rel of its expected value (absolute rel below 1). labels: the
    boxes' names as the learner sees them, used to say which answers are not yet right."""
    def check(answers: dict, labels: Mapping[str, str] | None = None) -> tuple[bool, str]:
        wrong = [k for k, v in expected.items() if abs(answers.get(k, 0.0) - v) > rel * max(1.0, abs(v))]
        names = [(labels or {}).get(k, k) for k in wrong]
        return (not wrong, f"right (within {rel:.0%})" if not wrong else f"not yet: {', '.join(names)}{unit}")
    return check


class Exercise:
    """A question with answer boxes, a Check button and a Show-solution button.

    check(answers: dict[str, float]) -> (ok, message); solution is markdown. Without a frontend, show()
    prints the question and the solution inside a collapsed <details> block.
    """

    def __init__(self, title: str, question: str, fields: Mapping[str, str],
                 check: Callable[[dict], tuple[bool, str]], solution: str):
        self.title, self.question, self.check, self.solution = title, question, check, solution
        self.labels = dict(fields)
        self.inputs = {key: W.Text(description=name, placeholder="a number", style={"description_width": "initial"})
                       for key, name in fields.items()}
        self.result = W.HTML()
        self.revealed = W.Output()

    def answers(self) -> dict:
        """The typed answers as numbers; a ValueError naming the box for one that is not a number."""
        return {k: parse_number(w.value, self.labels[k]) for k, w in self.inputs.items()}

    def on_check(self, *_) -> tuple[bool, str]:
        try:
            answers = self.answers()
        except ValueError as e:
            ok, message = False, str(e)
        else:
            takes_labels = "labels" in inspect.signature(self.check).parameters
            ok, message = self.check(answers, labels=self.labels) if takes_labels else self.check(answers)
        color = "#1a7f37" if ok else "#cf222e"
        self.result.value = f"<span style='color:{color}'>{'✓' if ok else '✗'} {message}</span>"
        return ok, message

    def on_reveal(self, *_) -> None:
        from IPython.display import Markdown
        self.revealed.clear_output()
        self.revealed.append_display_data(Markdown(self.solution))

    def show(self) -> None:
        header = f"**{self.title}.** {self.question}"
        if not has_frontend():
            display({"text/markdown": f"{header}\n\n<details><summary>Solution</summary>\n\n{self.solution}\n\n"
                                      "</details>"}, raw=True)
            return
        check, reveal = W.Button(description="Check"), W.Button(description="Show solution")
        check.on_click(self.on_check)
        reveal.on_click(self.on_reveal)
        inputs = W.HBox(list(self.inputs.values()), layout=W.Layout(flex_flow="row wrap"))
        display(W.VBox([W.HTML(_md_to_html(header)), inputs,
                        W.HBox([check, reveal]), self.result, self.revealed]))


def _md_to_html(text: str) -> str:
    """Just enough markdown for a question line: **bold** and `code`."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)
