"""A learner's code written to a file and imported, as a notebook cell would define it: inspect can read its source
(a class's too), so the checkers can send it to the ranks."""

import importlib.util
from pathlib import Path


def load(tmp_path: Path, source: str, name: str):
    """The object `name` defined by `source`, imported from tmp_path/learner.py."""
    path = tmp_path / "learner.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("learner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
