"""A learner's code, run safely: its source read (from a notebook cell too, a class included) and sent to ranks,
rebuilt there, stopped at its line when it takes too long, and its errors told as its line, never a traceback.
What labtools.exercises checks runs through here; so do the lessons' rank functions that run a learner's code."""

import ast
import inspect
import linecache
import signal
import textwrap
import threading
from collections.abc import Callable
from contextlib import contextmanager


def is_stub(fn: Callable) -> bool:
    """True while the function still raises NotImplementedError at its top level (the template as given); for a
    class, while one of its methods does."""
    try:
        tree = ast.parse(source_of(fn))
    except (ValueError, SyntaxError):
        return False
    top = tree.body[0] if tree.body else None
    if isinstance(top, ast.ClassDef):
        methods = [node for node in top.body if isinstance(node, ast.FunctionDef)]
        return any(_raises_not_implemented(m.body) for m in methods)
    return _raises_not_implemented(top.body if isinstance(top, ast.FunctionDef) else [])


def _raises_not_implemented(body: list) -> bool:
    """A `raise NotImplementedError` among these statements, or in the loops and branches among them (the
    template's "your code here"), not in functions they define."""
    for node in body:
        if isinstance(node, (ast.For, ast.While, ast.If, ast.With)):
            if _raises_not_implemented(node.body) or _raises_not_implemented(getattr(node, "orelse", [])):
                return True
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if getattr(exc, "id", "") == "NotImplementedError":
                return True
    return False


def source_of(fn: Callable) -> str:
    """The source of a function defined with `def`, or of a class (in a notebook cell too), to rebuild it in another
    process."""
    if fn.__name__ == "<lambda>":
        raise ValueError("write the exercise as a `def` function: a lambda's source cannot be sent to the ranks")
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        found = _class_source(fn) if inspect.isclass(fn) else ""
        if found:
            return found
        raise ValueError(f"the source of {fn.__name__} cannot be read ({e}): define it in a notebook cell") from e


def _class_source(cls: type) -> str:
    """A class's source from the cell its methods were compiled in (inspect cannot find a class defined in a
    notebook cell: its module, __main__, has no file); "" where there is none."""
    methods = [v for v in vars(cls).values() if inspect.isfunction(v)]
    if not methods:
        return ""
    text = "".join(linecache.getlines(methods[0].__code__.co_filename))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return textwrap.dedent(ast.get_source_segment(text, node, padded=True) or "") + "\n"
    return ""


def _source(fn: Callable) -> str:
    """fn's source, its first line its `def` (as where_it_failed counts lines); "" where it cannot be read."""
    try:
        return source_of(fn)
    except ValueError:
        return ""


def load_function(source: str, name: str, namespace: dict) -> Callable:
    """Rebuild a learner's function from its source in `namespace` (what it may use). This runs the learner's own
    code, from their notebook, in the ranks of their own run: it is treated like the cell it came from."""
    code = compile(source, f"<your {name}>", "exec")
    exec(code, namespace)  # noqa: S102 - the learner's own cell, sent to their own ranks
    return namespace[name]


# A learner's function may take this many times as long as the reference on the same case (timed just before), and
# at least BOUND_FLOOR_S: a loop that never ends stops at its line
BOUND_FACTOR = 100
BOUND_FLOOR_S = 2.0


def bound_for(reference_s: float) -> float:
    """The seconds a learner's function may take where the reference took reference_s."""
    return max(BOUND_FACTOR * reference_s, BOUND_FLOOR_S)


class TookTooLong(BaseException):
    """Raised where a learner's code was when its time ran out. A BaseException, so that the learner's own
    `except Exception:` does not swallow it."""


@contextmanager
def time_bound(seconds: float):
    """Within the block, raise TookTooLong after `seconds`, at the line the main thread is running (SIGALRM: Python
    code is interrupted between two lines; a call into C ends first, so bound those with their own timeouts).
    Off the main thread, where no signal can reach, the block runs unbounded."""
    if not seconds > 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TookTooLong(f"your function did not finish in {seconds:.3g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# What a learner's call may end with, each turned into a message: an error, sys.exit(), a loop out of its time
LEARNER_ERRORS = (Exception, SystemExit, TookTooLong)


def failure(error: BaseException, fn: Callable) -> str:
    """where_it_failed for a function defined in this process (a notebook cell): its file and its source."""
    return where_it_failed(error, fn.__code__.co_filename, _source(fn))


def where_it_failed(error: BaseException, filename: str, source: str = "") -> str:
    """'TypeError: ... (line 4 of your function: `y = x @ w`)': the error and the learner's line (the last frame of
    the traceback in `filename`, where their function was compiled; its text from `source`), not a traceback."""
    cause = error  # a time bound that ran out is the cause, even where cleanup on the way out raised another error
    while cause is not None and not isinstance(cause, TookTooLong):
        cause = cause.__context__
    error = cause or error
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:  # a sent source counts from its first line (a class too)
            first = 1 if filename.startswith("<your ") else tb.tb_frame.f_code.co_firstlineno
            line = tb.tb_lineno - first + 1
        tb = tb.tb_next
    lines = source.splitlines()
    code = f": `{lines[line - 1].strip()}`" if line and 0 < line <= len(lines) else ""
    if isinstance(error, TookTooLong):
        return f"{error}{f' (it was at line {line}{code})' if line else ''}"
    at = f" (line {line} of your function{code})" if line else ""
    return f"{type(error).__name__}: {error}{at}"
