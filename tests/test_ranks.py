"""Rank processes import torch and the lab's core only: never the notebook's UI stack (seconds per rank)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANK_MODULES = sorted(f"lessons.ranks.{p.stem}" for p in (ROOT / "lessons" / "ranks").glob("*.py")
                      if p.stem != "__init__")
RANK_MODULES += ["labtools.dist.worker", "labtools.dist.toolkit", "labtools.dist.checks", "labtools.dist.comm"]
UI = ("plotly", "ipywidgets", "IPython", "nbformat", "jsonschema", "anywidget", "papermill")


def test_there_are_rank_modules():
    assert any(m.startswith("lessons.ranks.") for m in RANK_MODULES)


@pytest.mark.parametrize("module", RANK_MODULES)
def test_a_rank_module_imports_no_ui_package(module):
    code = (f"import sys, {module}\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({UI!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", f"{module} pulls in {out.stdout.strip()}"


def test_the_supervisor_starts_without_torch():
    """It sits between the caller and torchrun: importing torch there would add seconds to every launch."""
    code = "import sys, labtools.dist.supervise; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_no_lesson_launches_by_string():
    """Lessons pass the rank function itself (checked where it is defined), never a 'module:function' string."""
    import re
    hits = [f"{p.name}: {m.group(0)}" for p in (ROOT / "lessons").rglob("*.py")
            for m in re.finditer(r"launch\(\s*[\"'][\w.]+:\w+", p.read_text())]
    assert hits == []
