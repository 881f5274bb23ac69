"""Control panels: ipywidgets controls bound to a function that draws a plotly figure.

    panel = Panel(draw, {"depth": IntSlider(...), "width": IntSlider(...)})
    panel.show()

`draw(**values) -> go.Figure` is called with the controls' current values; the figure is shown
in the panel's own output area the way the notebook shows any figure, so it takes the output
area's width and follows the window (a FigureWidget was drawn at plotly's default 700 px: cut
off in a 1024-px window). Changes are debounced: while a slider is being dragged, only the last
value within `debounce_ms` draws.
Without a frontend (papermill, `make book`, LABTOOLS_STATIC=1) `show()` draws the default
values once as a static figure, so the notebook still shows something useful.

Training-driven panels wrap their experiment in `RunCache`, so a setting seen before answers
at once and a new one runs (with a progress bar) and is kept. Such a panel is `cancellable`: with
a frontend its draw runs beside the kernel (a thread), so the kernel stays free to hear its Cancel
button and the kernel's Interrupt; either stops the run at its next step (training steps and a
launch's wait check, labtools.progress.check_cancelled; a launch stops its ranks), and the panel
says so and puts its controls back to the values its figure shows.
"""

import asyncio
import contextvars
import html
import json
import signal
import statistics
import threading
import time
from collections.abc import Callable, Mapping

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from labtools.progress import Cancelled, bars_into, cancel_on, has_frontend

_RUNNING: set["Panel"] = set()  # cancellable panels whose draw is running now: the kernel's Interrupt cancels them


def _on_interrupt(signum, frame) -> None:
    """SIGINT while the kernel is idle (a panel's run in its thread): cancel the running panels. With none running
    this does what the kernel's idle handler does: nothing."""
    for panel in list(_RUNNING):
        panel.cancel()


def _hear_interrupts() -> None:
    """Let the kernel's Interrupt reach panels that run in a thread. ipykernel ignores SIGINT while idle and puts its
    idle handler back after each message it handles (Kernel.saved_sigint_handler): ours goes there. Without that
    attribute (another kernel), only the Cancel button stops a run."""
    try:
        from IPython import get_ipython
        kernel = getattr(get_ipython(), "kernel", None)
    except ImportError:
        return
    if kernel is not None and getattr(kernel, "saved_sigint_handler", None) in (signal.SIG_IGN, _on_interrupt):
        kernel.saved_sigint_handler = _on_interrupt


class Panel:

    def __init__(self, draw: Callable[..., go.Figure], controls: Mapping[str, W.ValueWidget], *,
                 debounce_ms: int = 120, title: str = "", cancellable: bool = False):
        self.draw = draw
        self.controls = dict(controls)
        self.debounce_ms = debounce_ms
        self.title = title
        self.cancellable = cancellable  # draw may train or launch: run it in a thread, with a Cancel button
        self.status = W.HTML()
        self.output = W.Output()  # progress bars of a redraw (e.g. a training run) appear here
        self.plot = W.Output(layout=W.Layout(width="100%"))  # the figure, as the notebook renders any figure
        self.cancel_button = W.Button(description="Cancel", icon="stop", disabled=True,
                                      tooltip="stop this run; the controls go back to the figure's values")
        self.cancel_button.on_click(lambda _: self.cancel())
        self.draw_ms: list[float] = []  # kernel-side time of each redraw
        self._figure: go.Figure | None = None
        self._pending = None
        self._shown: dict | None = None    # the values the figure was drawn with
        self._stop = threading.Event()     # set by cancel(): the running draw stops at its next check
        self._worker: threading.Thread | None = None
        self._again = False                # the controls moved while a draw ran: draw again when it ends
        self._quiet = False                # the panel is putting its controls back: not a change to draw
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
            if hasattr(control.style, "description_width") and not control.style.description_width:
                control.style.description_width = "initial"  # the whole label, never "checkpoin…"

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    @property
    def figure(self) -> go.Figure:
        """The figure shown now (drawn on first use)."""
        if self._figure is None:
            self.redraw()
        return self._figure

    def redraw(self) -> None:
        """Draw with the current values now. The kernel's Interrupt (or a Cancel) during the draw leaves the figure
        as it was and puts the controls back to its values."""
        t0 = time.perf_counter()
        values = self.values()
        self.output.outputs = ()  # drop the previous draw's bars
        try:
            with bars_into(self.output.append_display_data), cancel_on(self._stop):
                new = self.draw(**values)
        except (KeyboardInterrupt, Cancelled):
            self._cancelled()
            return
        except Exception as e:  # shown in the panel: a callback's traceback would only reach the server log
            self._error(e)
            return
        self._show(new, values, t0)

    def _error(self, e: Exception) -> None:
        self.status.value = (f"<span class='lab-panel-error' style='color:#cf222e'>"
                             f"{html.escape(f'{type(e).__name__}: {e}')}</span>")

    def _cancelled(self) -> None:
        """The figure stays; the controls go back to its values; the run's frozen bars go."""
        self._stop.clear()
        self.output.outputs = ()
        if self._shown is not None and self.values() != self._shown:
            self._quiet = True
            try:
                for name, value in self._shown.items():
                    self.controls[name].value = value
            finally:
                self._quiet = False
        shown = ", ".join(f"{self.controls[k].description or k} {v}" for k, v in (self._shown or {}).items())
        self.status.value = ("<span class='lab-panel-cancelled' style='color:#9a6700'>cancelled: nothing is left "
                             f"running; the figure and the controls show {html.escape(shown)}</span>")

    def _show(self, new: go.Figure, values: dict, t0: float) -> None:
        self._figure = new
        if has_frontend():  # replaced in one message: the old figure stays until the new one is drawn
            spec = json.loads(new.to_json(validate=False))
            self.plot.outputs = ({"output_type": "display_data", "metadata": {},
                                  "data": {"application/vnd.plotly.v1+json": spec,
                                           "text/plain": f"<figure: {self.title or 'panel'}>"}},)
        ms = (time.perf_counter() - t0) * 1e3
        self.draw_ms.append(ms)
        self._shown = values
        # data-draw counts the draws: a browser test sees a redraw even when the figure came out the same
        self.status.value = f"<small style='color:#666' data-draw='{len(self.draw_ms)}'>redrawn in {ms:.0f} ms</small>"

    def cancel(self) -> None:
        """Stop the running draw at its next check (a training step, a launch's wait); safe from any thread."""
        self._stop.set()

    def _on_change(self, change) -> None:
        if self._quiet:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a plain script): draw at once
            self.redraw()
            return
        if self.cancellable and has_frontend():
            self._start(loop)
            return
        if self.debounce_ms <= 0:
            self.redraw()
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self.debounce_ms / 1e3, self.redraw)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Draw the current values in a thread; the kernel stays free to hear Cancel and Interrupt."""
        if self._worker is not None and self._worker.is_alive():
            self._again = True  # one draw at a time: the latest values are drawn when this one ends
            return
        values = self.values()
        self._stop.clear()
        self.output.outputs = ()
        self.cancel_button.disabled = False
        self.status.value = "<small style='color:#666'>running… (Cancel, or the kernel's Interrupt, stops it)</small>"
        _RUNNING.add(self)
        _hear_interrupts()
        context = contextvars.copy_context()  # the kernel's display hooks, into the thread
        self._worker = threading.Thread(target=context.run, args=(self._work, values, loop), daemon=True)
        self._worker.start()

    def _work(self, values: dict, loop: asyncio.AbstractEventLoop) -> None:
        t0 = time.perf_counter()
        try:
            with bars_into(self.output.append_display_data), cancel_on(self._stop):
                figure = self.draw(**values)
            # a Cancel that came after the run's last check (its last step, its figure) still cancels it
            outcome = ("cancelled", None) if self._stop.is_set() else ("drawn", figure)
        except Cancelled:
            outcome = ("cancelled", None)
        except Exception as e:  # noqa: BLE001 - shown in the panel, like redraw()'s
            outcome = ("error", e)
        loop.call_soon_threadsafe(self._finish, outcome, values, t0)  # widgets and figure: on the kernel's thread

    def _finish(self, outcome: tuple, values: dict, t0: float) -> None:
        self._worker.join()  # it handed this over as its last act: it is ending, or has ended
        _RUNNING.discard(self)
        self.cancel_button.disabled = True
        kind, result = outcome
        if kind == "drawn":
            self._show(result, values, t0)
        elif kind == "error":
            self._error(result)
        else:
            self._again = False
            self._cancelled()
        if self._again:
            self._again = False
            if self.values() != values:
                self._start(asyncio.get_running_loop())

    def wait(self, timeout: float = 600) -> None:
        """Block until a draw running in the panel's thread has ended (tests and scripts)."""
        if self._worker is not None:
            self._worker.join(timeout)

    def time_redraw(self, control: str, values: list, repeats: int = 3) -> float:
        """Median kernel-side redraw time in ms while `control` steps through `values` (no debounce)."""
        _ = self.figure
        saved, self.debounce_ms = self.debounce_ms, 0
        cancellable, self.cancellable = self.cancellable, False  # each draw now, in this thread
        start = len(self.draw_ms)
        original = self.controls[control].value
        for _ in range(repeats):
            for v in values:
                self.controls[control].value = v
        self.controls[control].value = original
        self.debounce_ms, self.cancellable = saved, cancellable
        return statistics.median(self.draw_ms[start:])

    def widget(self) -> W.Widget:
        header = [W.HTML(f"<b>{self.title}</b>")] if self.title else []
        buttons = [self.cancel_button] if self.cancellable else []
        controls = W.HBox(list(self.controls.values()) + buttons, layout=W.Layout(flex_flow="row wrap"))
        _ = self.figure
        box = W.VBox(header + [controls, self.output, self.plot, self.status])
        box.add_class("lab-panel")  # how a browser test finds each panel, its controls and its figure
        return box

    def show(self) -> None:
        """The live panel with a frontend; otherwise the figure for the default values."""
        if has_frontend():
            display(self.widget())
            return
        rows = "\n".join(f"| {k} | {getattr(v, 'value', v)!r} |" for k, v in self.values().items())  # enums by value
        display({"text/markdown": f"*{self.title + ': ' if self.title else ''}the figure for the panel's starting "
                                  "values; open the notebook in JupyterLab to move the controls.*\n\n<details><summary>"
                                  f"Starting values</summary>\n\n| control | value |\n|---|---|\n{rows}\n\n</details>"},
                raw=True)
        self.draw(**self.values()).show()
