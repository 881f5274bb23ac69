"""Rank processes import torch and the lab's core only: never the notebook's UI stack (seconds per rank).

A lesson package's __init__ (its settings) is imported by its ranks, so it is held to the same rule."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.parent.name for p in (ROOT / "lessons").glob("*/__init__.py"))
RANK_MODULES = [f"lessons.{name}" for name in LESSONS]  # each lesson's settings
RANK_MODULES += sorted(f"lessons.{p.parent.name}.{p.stem}" for pattern in ("*/ranks.py", "*/*_ranks.py")
                       for p in (ROOT / "lessons").glob(pattern))
RANK_MODULES += ["labtools.parallel.worker", "labtools.parallel.toolkit", "labtools.parallel.checks",
                 "labtools.parallel.comm", "labtools.config"]
UI = ("plotly", "ipywidgets", "IPython", "nbformat", "jsonschema", "anywidget", "papermill")


def test_there_are_rank_modules_and_every_lesson_is_a_package():
    assert len(LESSONS) >= 13 and sum(m.endswith(".ranks") for m in RANK_MODULES) >= 6
    assert [p.name for p in (ROOT / "lessons").glob("*.py")] == ["__init__.py"], "a lesson is a package"


def ui_pulled_in(modules: list[str]) -> dict[str, list[str]]:
    """Import `modules` one after another in one fresh interpreter (torch is imported once, not once per module):
    the UI packages each import added to sys.modules. The first module that pulls one in is the one named."""
    code = ("import importlib, json, sys\n"
            f"ui, seen, out = set({UI!r}), set(), {{}}\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    now = {m.split('.')[0] for m in sys.modules} & ui\n"
            "    out[name] = sorted(now - seen)\n"
            "    seen |= now\n"
            "print(json.dumps(out))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_no_rank_module_imports_a_ui_package():
    pulled = ui_pulled_in(RANK_MODULES)
    assert list(pulled) == RANK_MODULES
    offenders = {m: p for m, p in pulled.items() if p}
    assert not offenders, f"rank modules that pull in UI packages: {offenders}"


def test_the_ui_check_names_the_module_that_pulls_one_in():
    pulled = ui_pulled_in(["labtools.parallel.comm", "lessons.data_parallel.equivalence"])  # a notebook section
    assert pulled["labtools.parallel.comm"] == [] and "plotly" in pulled["lessons.data_parallel.equivalence"]


@pytest.mark.ranks
def test_the_supervisor_starts_without_torch():
    """It sits between the caller and torchrun: importing torch there would add seconds to every launch."""
    code = "import sys, labtools.parallel.supervise; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_no_lesson_launches_by_string():
    """Lessons pass the rank function itself (checked where it is defined), never a 'module:function' string."""
    import re
    hits = [f"{p.name}: {m.group(0)}" for p in (ROOT / "lessons").rglob("*.py")
            for m in re.finditer(r"launch\(\s*[\"'][\w.]+:\w+", p.read_text())]
    assert hits == []
