"""Progress bars that behave in JupyterLab, under papermill, and in a terminal.

With a live frontend, tqdm.auto draws a widget bar. Without one (papermill, `make book`,
scripts: LABTOOLS_STATIC=1 or no IPython kernel), a widget bar would be saved as a stale
"0%" line, so a plain text bar is used: it appears only after 2 s and redraws every 30 s.
"""

import os
import sys


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
        from tqdm.auto import tqdm
        return tqdm(iterable, total=total, desc=desc, leave=leave, **kwargs)
    from tqdm import tqdm
    kwargs.setdefault("mininterval", 30.0)
    kwargs.setdefault("delay", 2.0)
    return tqdm(iterable, total=total, desc=desc, leave=leave, file=sys.stdout, **kwargs)
