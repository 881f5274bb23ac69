"""Which functions a run may name: a job file is code, so a target must come from the lab's packages.

    resolve_target("lessons.data_parallel.ranks:equivalence") -> (target, function)
    target_of(fn) -> "module:qualname", refusing lambdas, closures and functions defined in a notebook

Extra module prefixes come from the caller (launch(..., allow=...)) or LABTOOLS_ALLOW_TARGETS in this process's
environment, never from the job file.
"""

import importlib
import inspect
import os
import sys
from pathlib import Path

ALLOW_ENV = "LABTOOLS_ALLOW_TARGETS"        # extra module prefixes a job may name, comma-separated
TRUSTED_PACKAGES = ("labtools", "lessons")  # a job file is code: by default it may only name these


def allowed_prefixes(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    env = tuple(p.strip() for p in os.environ.get(ALLOW_ENV, "").split(",") if p.strip())
    return TRUSTED_PACKAGES + env + tuple(extra)


def _allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def target_of(fn, allow: tuple[str, ...] = ()) -> str:
    """'module:qualname' of a rank function, refusing what another process could not import by name."""
    if isinstance(fn, str):
        return resolve_target(fn, allow)[0]
    if not inspect.isfunction(fn):
        raise ValueError(f"launch takes a module-level function, got {fn!r}")
    where = f"{fn.__module__}.{fn.__qualname__}"
    if fn.__name__ == "<lambda>":
        raise ValueError(f"launch cannot send a lambda ({where}) to other processes: define a function in a module")
    if "<locals>" in fn.__qualname__:
        raise ValueError(f"launch cannot send a closure ({where}) to other processes: define it at module level")
    if fn.__module__ in (None, "__main__") or fn.__module__.startswith("__"):
        raise ValueError(f"{fn.__qualname__} is defined in a notebook or script (module {fn.__module__!r}); ranks "
                         "import their function by name: put it in a .py module (e.g. lessons/<topic>/ranks.py)")
    target = f"{fn.__module__}:{fn.__qualname__}"
    found, _ = resolve_target(target, allow)
    return found


def resolve_target(target: str, allow: tuple[str, ...] = ()):
    module, sep, qualname = target.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"target must be 'package.module:function', got {target!r}")
    if module == "__main__":
        raise ValueError("a target in __main__ cannot be imported by the ranks: put the function in a module")
    if not _allowed(module, allowed_prefixes(allow)):
        raise ValueError(f"target module {module!r} is outside the lab's packages {TRUSTED_PACKAGES}: a job runs code, "
                         f"so other modules must be allowed explicitly (launch(..., allow=({module!r},)) or "
                         f"{ALLOW_ENV}={module})")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"target module {module!r} cannot be imported: {e}") from e
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not inspect.isfunction(obj):
        raise ValueError(f"target {target!r}: module {module!r} has no function {qualname!r}")
    return target, obj


def root_of(module: str) -> str:
    """The sys.path entry that provides an imported module (a.b.c in ROOT/a/b/c.py -> ROOT)."""
    file = Path(sys.modules[module].__file__).resolve()
    depth = module.count(".") + (1 if file.name == "__init__.py" else 0)
    return str(file.parents[depth])
