"""Progress bars that behave in JupyterLab, under papermill, and in a terminal.

With a live frontend, tqdm.auto draws a widget bar. Without one (papermill, `make book`,
scripts: LABTOOLS_STATIC=1 or no IPython kernel), a widget bar would be saved as a stale
"0%" line, so a plain text bar is used: it appears only after 2 s and redraws every 30 s.

A panel's Cancel reaches long work through `check_cancelled()`, which training steps and a launch's wait call:
inside `cancel_on(event)` it raises Cancelled once the event is set.
"""

import os
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

# Where widget bars go instead of display(): set by a widget panel while it redraws. Output from
# a widget callback belongs to no cell, so a panel hands each bar's widget to its own Output area.
_sink: ContextVar[Callable | None] = ContextVar("labtools_progress_sink", default=None)
# The Cancel of the panel whose run this is: long loops (training steps, a launch's wait) check it.
_stop: ContextVar[threading.Event | None] = ContextVar("labtools_progress_stop", default=None)


class Cancelled(Exception):
    """The learner cancelled the run (a panel's Cancel button, or the kernel's Interrupt while a panel ran)."""


@contextmanager
def cancel_on(event: threading.Event):
    """Within this block, check_cancelled() raises Cancelled once `event` is set."""
    token = _stop.set(event)
    try:
        yield
    finally:
        _stop.reset(token)


def check_cancelled() -> None:
    """Raise Cancelled if the run this code belongs to was cancelled (cheap: call it every step)."""
    event = _stop.get()
    if event is not None and event.is_set():
        raise Cancelled("cancelled")


def has_frontend() -> bool:
    """True inside a Jupyter kernel that a browser is attached to (LABTOOLS_STATIC unset)."""
    if os.environ.get("LABTOOLS_STATIC", "") not in ("", "0"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def progress(iterable=None, *, total: int | None = None, desc: str = "", leave: bool = True, **kwargs):
    """A tqdm bar: the widget bar with a frontend, else a quiet text bar on stdout."""
    if has_frontend():
        # at most two redraws a second: each one re-lays out the whole notebook page in the browser, which on a
        # 2-core machine competes with the training it reports (tqdm's default is ten)
        kwargs.setdefault("mininterval", 0.5)
        sink = _sink.get()
        if sink is None:
            from tqdm.auto import tqdm
            return tqdm(iterable, total=total, desc=desc, leave=leave, **kwargs)
        from tqdm.notebook import tqdm
        bar = tqdm(iterable, total=total, desc=desc, leave=leave, display=False, **kwargs)
        sink(bar.container)
        return bar
    from tqdm import tqdm
    kwargs.setdefault("mininterval", 30.0)
    kwargs.setdefault("delay", 2.0)
    return tqdm(iterable, total=total, desc=desc, leave=leave, file=sys.stdout, **kwargs)


@contextmanager
def bars_into(sink: Callable[[object], None]):
    """Within this block, progress() hands each widget bar to sink(widget) instead of displaying it."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
