"""Every lesson as its readers meet it: JupyterLab in a real (headless) Chromium, Run All, then one control of
every panel moved and its figure seen to change.

This is also where `make test` executes the notebooks (PROFILE="smoke"): the notebook JupyterLab saved is read
like papermill's output, and every claim of its ledger must hold. (papermill still runs lesson 00 at the low
edges of its parameters in test_notebooks.py, and runs every lesson for `make book`.)
Screenshots of failures go to build/browser/; each lesson's timings to build/browser/<lesson>.json.
"""

import json
import os
import secrets
import threading
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from jupyter_browser import (KERNELSPEC, Browser, JupyterLab, cell_errors, close_notebook, leftovers, move_and_watch,
                             open_notebook, page_problems, panels, run_all, save, smoke_copy)
from labtools.claims import read_ledgers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = ROOT / "build" / "browser"
RUN_TIMEOUT_S = 300   # a smoke notebook takes about a minute; this only bounds a hang
PANEL_TIMEOUT_S = 120  # training panels run one small training; formula panels answer in well under a second

pytestmark = [pytest.mark.notebook, pytest.mark.browser]


# Two lessons run at once (two Chromium pages, two kernels of one torch thread each), except the lessons that read
# the loopback interface's byte counters around their collectives: any other lesson's traffic there (kernel and
# browser messages, figures) would be counted with theirs, so they run alone, one after another, at the end.
# One torch thread per kernel: beside Chromium and the server, a two-thread kernel ran a lesson no faster than a
# one-thread one here (01 64-69 s vs 67 s, 03 59-63 vs 59), and two one-thread kernels train ~1.5x as much as
# one two-thread kernel (two-thread kernels side by side stall each other's OpenMP threads).
WIRE = {"07_data_parallel", "08_fsdp_zero", "09_pipeline_parallel", "10_tensor_parallel"}
LAUNCHING = WIRE | {"11_fault_tolerance", "12_compute_budget"}  # close waits for their launches' teardown
# the other lessons in two lanes of similar length (Run All at smoke, seconds: 04 81, 02 74, 03 63, 06 14, 05 26 |
# 01 69, 11 61, 12 ~60, 00 50); both launching lessons in one lane, so neither waits on the other's run directories
LANES = (["04_mixed_precision", "02_lr_schedules", "03_stability", "06_memory_budget",
          "05_activation_checkpointing", "planted"],
         ["01_adamw_vs_adam_l2", "11_fault_tolerance", "12_compute_budget", "00_training_loop"])


class Lanes:
    """Drives every lesson in background threads (each with its own Playwright and Chromium: Playwright's sync
    API is per thread): LANES side by side, then the WIRE lessons one at a time. A test waits for its lesson."""

    def __init__(self, server: JupyterLab, marker: str, names: list[str]):
        lanes = [[n for n in lane if n in names] for lane in LANES]
        placed = {n for lane in lanes for n in lane}
        lanes[0] += [n for n in names if n not in placed and n not in WIRE]  # a new lesson: run it too
        self.server, self.marker, self.lanes = server, marker, lanes
        self.solo = [n for n in names if n in WIRE]
        self.results: dict[str, object] = {}
        self.done = {n: threading.Event() for n in names}
        self.shared_done = threading.Barrier(len(lanes))
        self.threads = [threading.Thread(target=self._lane, args=(i,), daemon=True) for i in range(len(lanes))]

    def __enter__(self) -> "Lanes":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        for t in self.threads:
            t.join(timeout=RUN_TIMEOUT_S + 2 * PANEL_TIMEOUT_S)

    def _lane(self, i: int) -> None:
        with Browser(self.marker) as browser:
            page = browser.new_page()  # one page: each lesson opens from the file browser, as a reader's would
            for name in self.lanes[i]:
                self._drive(page, name, f"lane{i}")
            try:
                self.shared_done.wait(timeout=30 * RUN_TIMEOUT_S)
            except threading.BrokenBarrierError:
                pass
            if i == 0:
                for name in self.solo:
                    self._drive(page, name, f"lane{i}")

    def _drive(self, page, name: str, workspace: str) -> None:
        try:
            self.results[name] = drive(self.server, page, f"{name}.ipynb", screenshot=name != "planted",
                                       settle_s=15 if name in LAUNCHING else 0, workspace=workspace)
        except BaseException as e:  # noqa: BLE001 - handed to the lesson's test
            self.results[name] = e
        finally:
            self.done[name].set()

    def result(self, name: str) -> dict:
        if not self.done[name].wait(timeout=30 * RUN_TIMEOUT_S):
            raise TimeoutError(f"{name}: never driven")
        r = self.results[name]
        if isinstance(r, BaseException):
            raise r
        return r


@pytest.fixture(scope="module")
def lab(tmp_path_factory, session_run_root):
    root = tmp_path_factory.mktemp("lab")
    for path in NOTEBOOKS:
        smoke_copy(path, root / path.name)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in PLANTED])
    nb.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(nb, root / "planted.ipynb")
    marker = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k != "LABTOOLS_STATIC"}  # a live frontend this time
    env["OMP_NUM_THREADS"] = "1"  # every kernel: one torch thread (see LANES)
    names = [p.stem for p in NOTEBOOKS] + ["planted"]
    with JupyterLab(root, marker, env=env) as server, Lanes(server, marker, names) as lanes:
        yield lanes
    left = leftovers(marker)
    assert not left, "processes left after JupyterLab and Chromium were stopped:\n" + "\n".join(left)
    dirs = [p.name for p in session_run_root.glob("labtools-dist-*")]
    assert not dirs, f"the lessons' launches left run directories behind: {dirs}"


def drive(server: JupyterLab, page, name: str, screenshot: bool = True, settle_s: float = 15,
          workspace: str | None = None) -> dict:
    """Open, Run All, save, check the page, move every panel, close. Returns what was seen; screenshots a
    failure (unless it was planted)."""
    seen = {"lesson": Path(name).stem, "stages_s": {}}
    clock = time.monotonic()

    def stage(label):
        nonlocal clock
        seen["stages_s"][label] = round(time.monotonic() - clock, 2)
        clock = time.monotonic()

    try:
        seen["stages_s"]["page"] = round(open_notebook(page, server, name, workspace=workspace), 2)
        stage("open")
        seen["run"] = run_all(page, server, name, RUN_TIMEOUT_S)
        stage("run all")
        seen["saved"] = save(page, server, name)
        seen["errors"] = cell_errors(seen["saved"])
        stage("save")
        seen["problems"] = page_problems(page)
        seen["figures"] = page.locator(".js-plotly-plot").count()
        stage("check")
        # down rather than up: a panel that trains then trains something smaller (fewer layers, ranks, steps)
        seen["panels"] = [move_and_watch(page, p, PANEL_TIMEOUT_S, step=-1) for p in panels(page)]
        stage("panels")
        failed = seen["errors"] or seen["problems"] or any(p["error"] or p["changed_ms"] is None
                                                           for p in seen["panels"])
        if failed and screenshot:
            shoot(page, seen["lesson"])
        return seen
    except Exception:
        shoot(page, seen["lesson"])
        raise
    finally:
        close_notebook(page, server, name, settle_s)  # and shut its kernel down before the next lesson


def cell_seconds(nb) -> list[list]:
    """[code cell index, seconds, its first line] from the timing JupyterLab recorded (recordTiming)."""
    out = []
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        t = cell["metadata"].get("execution", {})
        start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        if start and end:
            seconds = (datetime.fromisoformat(end.replace("Z", "+00:00"))
                       - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            out.append([i, round(seconds, 2), source.split("\n")[0][:80]])
    return out


def shoot(page, lesson: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{lesson}.png"), full_page=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_lesson_runs_in_jupyterlab_and_its_panels_respond(path, lab, record_property):
    seen = lab.result(path.stem)
    lesson, run = seen["lesson"], seen["run"]
    record_property("seconds", round(run["seconds"], 1))
    print(f"{lesson}: {seen['stages_s']}; " + "; ".join(
        f"{p['title']}: {p['action']} → figure changed after {p['changed_ms'] or float('nan'):.0f} ms"
        for p in seen["panels"]))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{lesson}.json").write_text(json.dumps(
        {"stages_s": seen["stages_s"], "cells_s": cell_seconds(seen["saved"]), "panels": seen["panels"]}, indent=1))

    assert not seen["errors"], f"{lesson}: a cell failed in the browser: {seen['errors'][0]}"
    unrun = [i for i, p in enumerate(run["prompts"]) if "[ ]" in p or "*" in p]
    assert not unrun, f"{lesson}: code cells {unrun} did not run"
    assert not seen["problems"], f"{lesson}: " + "; ".join(seen["problems"])
    assert seen["figures"], f"{lesson}: no plotly figure rendered"

    ledgers = read_ledgers(seen["saved"])
    claims = [c for ledger in ledgers for c in ledger["claims"]]
    assert claims, f"{lesson}: the notebook displayed no claims ledger (or an empty one)"
    failed = [f"{c['statement']}: measured {c['measured']}, expected {c['expected']}"
              for c in claims if not c["passed"]]
    assert not failed, f"{lesson}: claims that did not hold:\n" + "\n".join(failed)

    for p in seen["panels"]:
        assert not p["error"], f"{lesson}: panel {p['title']!r} failed after {p['action']}: {p['error']}"
        assert p["changed_ms"] is not None, \
            f"{lesson}: panel {p['title']!r}: {p['action']}, but its figure did not change in {PANEL_TIMEOUT_S} s"


PLANTED = [
    "from labtools.widgets import Panel, slider\nimport plotly.graph_objects as go\n",
    "def draw(k):\n    if k != 3:\n        raise RuntimeError(f'planted failure at k={k}')\n"
    "    return go.Figure(go.Scatter(y=[k, 1]))\n"
    "Panel(draw, {'k': slider(3, 1, 5, description='k')}, debounce_ms=0, title='Broken on purpose').show()",
    "1 / 0",
    "print('never reached')",
]


def test_the_harness_reports_a_failing_cell_and_a_failing_panel(lab):
    """The checks above can fail: Run All stops at a cell that raises (the cells after it left unrun) and the
    saved notebook names its error; a panel whose callback raises is named with its error, its figure unchanged."""
    seen = lab.result("planted")
    assert seen["errors"] and seen["errors"][0].startswith("ZeroDivisionError"), seen["errors"]
    assert [p.strip() for p in seen["run"]["prompts"]] == ["[1]:", "[2]:", "[3]:", "[ ]:"], seen["run"]
    assert not seen["problems"], seen["problems"]
    (panel,) = seen["panels"]
    assert panel["title"] == "Broken on purpose"
    assert panel["error"] and "planted failure at k=2" in panel["error"], panel
    assert panel["changed_ms"] is None
