"""labtools.headless runs a notebook as plain Python (how lessons run on the GPU machines, which have no Jupyter) and
keeps its ledger as JSON; a cell that raises is reported with its traceback, not hidden."""

import json
import subprocess
import sys

import pytest

from labtools import headless

ROOT = headless.ROOT


def test_a_lesson_runs_without_jupyter_and_keeps_its_ledger(tmp_path):
    done = subprocess.run([sys.executable, "-m", "labtools.headless", "06_memory_budget", "--profile", "smoke",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [path] = tmp_path.glob("*/06_memory_budget.json")
    result = json.loads(path.read_text())
    assert result["error"] is None and result["profile"] == "smoke" and result["settings"]["profile"] == "smoke"
    assert path.parent.name == headless.slug(result["environment"]["device_name"])
    claims = result["ledger"]["claims"]
    assert len(claims) >= 10 and all(c["passed"] for c in claims)
    assert len(result["cells"]) == len(headless.code_cells("06_memory_budget")) and result["figures_drawn"] >= 1
    assert "claims" in done.stdout and "hold" in done.stdout


def test_a_failing_cell_is_reported(tmp_path, monkeypatch):
    cells = headless.code_cells("06_memory_budget")
    broken = cells[:3] + [("raise RuntimeError('planted')", False)] + cells[3:]
    monkeypatch.setattr(headless, "code_cells", lambda lesson: broken)
    monkeypatch.setattr(headless, "_quiet_display", lambda: {"ledgers": [], "displayed": 0, "figures": 0})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(headless.os, "chdir", lambda path: None)
    result = headless.run_lesson("06_memory_budget", "smoke")
    assert result["error"]["cell"] == 3 and "planted" in result["error"]["traceback"]
    assert len(result["cells"]) == 4 and result["ledger"] is None


@pytest.mark.parametrize("args", [["99_nothing"], ["06_memory_budget", "--profile", "tpu"]])
def test_bad_arguments_are_refused(args):
    with pytest.raises(SystemExit):
        headless.main(args)


def test_slug():
    assert headless.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
