"""Every lesson as its readers meet it: JupyterLab in a real (headless) Chromium, Run All, then every control of
every panel moved and its figure seen to change.

This is also where `make test` executes the notebooks (PROFILE="smoke"): the notebook JupyterLab saved is read
like papermill's output, and every claim of its ledger must hold. (papermill still runs lesson 00 at the low
edges of its parameters in test_notebooks.py, and runs every lesson for `make book`.)
Screenshots of failures go to build/browser/; each lesson's stage and cell timings to build/browser/<lesson>.json.
One lesson at a time: a two-lanes version (two pages, one torch thread per kernel) ran the suite in 586 s instead of
~710 s, but twice in three fresh-clone runs a lesson's panel figures stayed frozen (cause not found); it was
reverted.
"""

import importlib
import json
import os
import secrets
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from jupyter_browser import (KERNELSPEC, Browser, JupyterLab, cell_errors, close_notebook, controls,
                             figure_layout_problems, fill_exercise, leftovers, move_and_watch, open_notebook,
                             page_problems, panels, run_all, save, shown, smoke_copy, start_and_stop,
                             stop_runs)
from test_prose import FRAMED, read_problems

from labtools.claims import HEADLINE_MAX, KINDS, read_ledgers

ROOT = Path(__file__).resolve().parents[1]
# Lessons that read the loopback interface's byte counters, or whose claims time ranks against a prediction, run
# last, and not while another test process launches ranks: tests/suite.py (make test) names a file in
# LABTOOLS_WAIT_FOR that appears when its unit tests that start ranks are done, and one in LABTOOLS_WAIT_FOR_ALL that
# appears when all are. Lesson 16 times its ranks: it waits for all (its calibration beside the unit tests: two
# ranks took 25.2 ms per step together against 10.7 ms alone, and its all-reduce measured 572 µs per ring step).
QUIET = ("07_data_parallel", "08_fsdp_zero", "09_pipeline_parallel", "10_tensor_parallel", "14_context_parallel",
         "15_mixture_of_experts", "16_plan_a_run")
TIMED = ("16_plan_a_run",)
# Lessons that train little run first, while make test's unit tests (tests/suite.py) keep the other core busy: two
# lanes that both train slow each other more than a training lane beside a drawing one (lesson 04's loss-scaling
# cell took 21 s alone and 39 s beside the unit tests).
LIGHT = ("05_activation_checkpointing", "06_memory_budget", "12_compute_budget", "13_profiling")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"),
                   key=lambda p: (p.stem in QUIET, p.stem not in LIGHT, p.stem))
WAIT_TIMEOUT_S = 1800
ARTIFACTS = ROOT / "build" / "browser"
RUN_TIMEOUT_S = 300   # a smoke notebook takes about a minute; this only bounds a hang
PANEL_TIMEOUT_S = 120  # training panels run one small training; formula panels answer in well under a second
FORMULA_TIMEOUT_S = 20
EXERCISE_TIMEOUT_S = 120
# The lessons whose exercise the browser fills in, with the module that holds its solution (solution_source()).
EXERCISES = {"00_training_loop": "lessons.training_loop.adamw_exercise",
             "01_adamw_vs_adam_l2": "lessons.adamw_vs_adam_l2.decay_exercise",
             "02_lr_schedules": "lessons.lr_schedules.schedule_exercise",
             "03_stability": "lessons.stability.clip_exercise",
             "04_mixed_precision": "lessons.mixed_precision.scaler_exercise",
             "05_activation_checkpointing": "lessons.activation_checkpointing.block_exercise",
             "06_memory_budget": "lessons.memory_budget.zero_exercise",
             "08_fsdp_zero": "lessons.fsdp_zero.partition_exercise",
             "09_pipeline_parallel": "lessons.pipeline_parallel.order_exercise",
             "10_tensor_parallel": "lessons.tensor_parallel.shard_exercise",
             "11_fault_tolerance": "lessons.fault_tolerance.save_exercise",
             "12_compute_budget": "lessons.compute_budget.flops_exercise",
             "13_profiling": "lessons.profiling.intensity_exercise",
             "14_context_parallel": "lessons.context_parallel.merge_exercise",
             "15_mixture_of_experts": "lessons.mixture_of_experts.router_exercise",
             "16_plan_a_run": "lessons.plan_a_run.memory_exercise",
             "07_data_parallel": "lessons.data_parallel.ring_exercise",
             "17_tokens_and_data": "lessons.tokens.bpe_exercise",
             "18_evidence": "lessons.evidence.interval_exercise",
             "19_muon_and_mup": "lessons.muon_mup.ns_exercise",
             "20_sft_and_dpo": ("lessons.finetune.sft_exercise", "lessons.finetune.dpo_exercise"),
             "21_rl_with_a_verifier": "lessons.rl_verifier.adv_exercise",
             "22_flash_attention_and_fp8": ("lessons.inside_kernels.flash_exercise",
                                            "lessons.inside_kernels.quant_exercise")}


# The lessons whose training or launching panel is stopped mid-run, once with Cancel and once with Interrupt.
STOPPED = ("00_training_loop", "07_data_parallel")


# `make screenshot`: the README's picture, taken by this test (the lesson's first panel, exercise done).
SCREENSHOT_ENV, SCREENSHOT_LESSON = "LAB_SCREENSHOT", "02_lr_schedules"


def photograph(page, out: Path) -> None:
    """The first panel of the lesson, figure drawn, as a PNG (a learner's view of a lesson)."""
    panel = page.locator(".jp-Notebook .jp-Cell").filter(has=page.locator(".lab-panel")).first
    panel.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    out.parent.mkdir(parents=True, exist_ok=True)
    panel.screenshot(path=str(out))


def solutions(lesson: str) -> list[str]:
    """The solution of each exercise of the lesson, in the order its cells come."""
    modules = EXERCISES[lesson]
    return [importlib.import_module(m).solution_source() for m in ((modules,) if isinstance(modules, str) else modules)]

pytestmark = [pytest.mark.notebook, pytest.mark.browser]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, session_run_root):
    root = tmp_path_factory.mktemp("lab")
    for path in NOTEBOOKS:
        smoke_copy(path, root / path.name)
    marker = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k != "LABTOOLS_STATIC"}  # a live frontend this time
    with JupyterLab(root, marker, env=env) as server, Browser(marker) as browser:
        yield server, browser.new_page()  # one page: each lesson opens from the file browser, as a reader's would
    left = leftovers(marker)
    assert not left, "processes left after JupyterLab and Chromium were stopped:\n" + "\n".join(left)
    dirs = [p.name for p in session_run_root.glob("labtools-run-*")]
    assert not dirs, f"the lessons' launches left run directories behind: {dirs}"


def drive(server: JupyterLab, page, name: str, screenshot: bool = True) -> dict:
    """Open, Run All, save, check the page, move every panel, close. Returns what was seen; screenshots a
    failure (unless it was planted)."""
    seen = {"lesson": Path(name).stem, "stages_s": {}}
    clock = time.monotonic()

    def stage(label):
        nonlocal clock
        seen["stages_s"][label] = round(time.monotonic() - clock, 2)
        clock = time.monotonic()

    try:
        seen["stages_s"]["page"] = round(open_notebook(page, server, name), 2)
        stage("open")
        seen["run"] = run_all(page, server, name, RUN_TIMEOUT_S)
        stage("run all")
        seen["saved"] = save(page, server, name)
        seen["errors"] = cell_errors(seen["saved"])
        stage("save")
        seen["problems"] = page_problems(page)
        seen["figures"] = page.locator(".js-plotly-plot").count()
        seen["layout"] = figure_layout_problems(page)
        stage("check")
        if seen["lesson"] in STOPPED:  # first, from the panel's own settings
            seen["stops"] = stop_runs(page, server, name)
            stage("cancel")
        # every control of every panel, one after another, each down rather than up: a panel that trains then
        # trains something smaller (fewer layers, ranks, steps). In a panel that trains, the first control's run
        # is watched to its figure; each other control's run is started and cancelled (the control is wired, at a
        # second's cost instead of a run's).
        seen["panels"], seen["started"] = [], []
        for p in panels(page):
            p.scroll_into_view_if_needed()
            for i in range(controls(p)):
                if not shown(p, i):  # hidden where it does not apply (09's v under GPipe and 1F1B)
                    continue
                if trains(p) and i > 0:
                    seen["started"].append(start_and_stop(page, server, name, p, i, -1))
                else:
                    seen["panels"].append(move_and_watch(page, p, PANEL_TIMEOUT_S if trains(p) else
                                                         FORMULA_TIMEOUT_S, step=-1, which=i))
        stage("panels")
        if seen["lesson"] in EXERCISES:
            seen["exercise"] = [fill_exercise(page, text, EXERCISE_TIMEOUT_S) for text in solutions(seen["lesson"])]
            stage("exercise")
        if os.environ.get(SCREENSHOT_ENV) and seen["lesson"] == SCREENSHOT_LESSON:
            photograph(page, Path(os.environ[SCREENSHOT_ENV]))
        failed = seen["errors"] or seen["problems"] or seen["layout"] or any(
            p["error"] or (p["changed_ms"] is None and p["redrawn_ms"] is None) for p in seen["panels"])
        if failed and screenshot:
            shoot(page, seen["lesson"])
        return seen
    except Exception:
        shoot(page, seen["lesson"])
        raise
    finally:
        close_notebook(page, server, name)  # and shut its kernel down before the next lesson


def wait_for_other_tests(env: str) -> None:
    """Block until the file named in env exists (make test's unit tests that start ranks, or all of them, have
    finished)."""
    flag = os.environ.get(env)
    if not flag:
        return
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not Path(flag).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the other tests did not finish within {WAIT_TIMEOUT_S} s ({flag} never appeared)")
        time.sleep(1)


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


def trains(panel) -> bool:
    """A panel that trains or launches (it has a Cancel button): moving a control may take a whole run."""
    return panel.locator("button", has_text="Cancel").count() > 0


def shoot(page, lesson: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{lesson}.png"), full_page=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_lesson_runs_in_jupyterlab_and_its_panels_respond(path, lab, record_property):
    server, page = lab
    if path.stem in QUIET:
        wait_for_other_tests("LABTOOLS_WAIT_FOR_ALL" if path.stem in TIMED else "LABTOOLS_WAIT_FOR")
    seen = drive(server, page, path.name)
    lesson, run = seen["lesson"], seen["run"]
    record_property("seconds", round(run["seconds"], 1))
    print(f"{lesson}: {seen['stages_s']}; " + "; ".join(
        f"{p['title']}: {p['action']} → figure changed after {p['changed_ms'] or float('nan'):.0f} ms"
        for p in seen["panels"]))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{lesson}.json").write_text(json.dumps(
        {"stages_s": seen["stages_s"], "cells_s": cell_seconds(seen["saved"]), "panels": seen["panels"],
         "stops": seen.get("stops"), "layout": seen.get("layout"),
         "started": seen.get("started")}, indent=1))

    assert not seen["errors"], f"{lesson}: a cell failed in the browser: {seen['errors'][0]}"
    unrun = [i for i, p in enumerate(run["prompts"]) if "[ ]" in p or "*" in p]
    assert not unrun, f"{lesson}: code cells {unrun} did not run"
    assert not seen["problems"], f"{lesson}: " + "; ".join(seen["problems"])
    assert seen["figures"], f"{lesson}: no plotly figure rendered"
    assert not seen["layout"], f"{lesson}: figures a learner cannot read whole:\n" + "\n".join(seen["layout"])

    ledgers = read_ledgers(seen["saved"])
    claims = [c for ledger in ledgers for c in ledger["claims"]]
    assert claims, f"{lesson}: the notebook displayed no claims ledger (or an empty one)"
    untagged = [c["statement"] for c in claims if c.get("kind") not in KINDS]
    assert not untagged, f"{lesson}: claims that do not say measured, counted or computed: {untagged}"
    failed = [f"{c['statement']}: {c['kind']} {c['measured']}, expected {c['expected']}"
              for c in claims if not c["passed"]]
    assert not failed, f"{lesson}: claims that did not hold:\n" + "\n".join(failed)
    headline = [c["statement"] for c in claims if not c.get("detail")]
    assert len(headline) <= HEADLINE_MAX, f"{lesson}: {len(headline)} headline claims (fold the rest: detail=True)"
    if lesson in FRAMED:  # what the run printed for the learner follows the same rules as the notebook's prose
        assert not read_problems(seen["saved"]), f"{lesson}: what a learner reads: {read_problems(seen['saved'])}"

    if lesson in EXERCISES:
        for printed in seen["exercise"]:
            assert "✓" in printed, f"{lesson}: an exercise, filled in with its solution, printed {printed!r}"
    for stop in seen["started"]:  # the other controls of a panel that trains: wired, and stopped cleanly
        assert stop["redrawn"] or (stop["started"] and stop["cancelled"] and stop["control_back"]
                                   and stop["figure_same"] and not stop["left"]), f"{lesson}: {stop}"
    for stop in seen.get("stops", []):
        assert stop.get("how") and stop["started"], f"{lesson}: no run to stop: {stop}"
        assert stop["cancelled"] and stop["button_off"], f"{lesson}: {stop['how']} did not say 'cancelled': {stop}"
        assert stop["control_back"] and stop["figure_same"], \
            f"{lesson}: after {stop['how']}, the control and the figure disagree: {stop}"
        assert not stop["left"], f"{lesson}: after {stop['how']}, processes of the run are left: {stop['left']}"
    firsts = {}
    for p in seen["panels"]:
        assert not p["error"], f"{lesson}: panel {p['title']!r} failed after {p['action']}: {p['error']}"
        assert p["changed_ms"] is not None or p["redrawn_ms"] is not None, \
            f"{lesson}: panel {p['title']!r}: {p['action']}, but it did not draw again"
        firsts.setdefault(p["title"], p)
    for title, p in firsts.items():  # a panel's first control, from its starting values, changes what it shows
        assert p["changed_ms"] is not None, f"{lesson}: panel {title!r}: {p['action']}, but its figure stayed the same"


PLANTED = [
    "from labtools.controls import slider\nfrom labtools.widgets import Panel\nimport plotly.graph_objects as go\n",
    "def draw(k):\n    if k != 3:\n        raise RuntimeError(f'planted failure at k={k}')\n"
    "    return go.Figure(go.Scatter(y=[k, 1]))\n"
    "k = slider(3, 1, 5, description='k, a label far too long for its box')\n"
    "k.style.description_width = '60px'  # cut, on purpose\n"
    "Panel(draw, {'k': k}, debounce_ms=0, title='Broken on purpose').show()",
    "go.Figure([go.Scatter(x=[1, 10], y=[1, 2], name='a'), go.Scatter(x=[1, 10], y=[2, 1], name='b')], layout=dict(\n"
    "    width=1600, title='Planted: too wide, legend over the title', xaxis_type='log',\n"
    "    legend=dict(orientation='h', x=0.05, y=1.0, yanchor='bottom', font_size=30),\n"
    "    annotations=[dict(x=40, y=1.5, text='off its axis')])).show()  # on a log axis x=40 means 10^40",
    "1 / 0",
    "print('never reached')",
]


def test_a_committed_notebook_opens_clean(lab):
    """Opened as committed (not a smoke copy), a notebook's tab shows no unsaved change: its metadata is what
    JupyterLab writes for this kernel. JupyterLab rewrites language_info from the kernel, so the tab is clean on the
    Python the notebooks record (tests/test_notebooks.py keeps every notebook's metadata the same) and dirty on any
    other, which this test then expects, naming the versions."""
    import platform
    import shutil

    server, page = lab
    source = NOTEBOOKS[0]
    shutil.copyfile(source, server.root / "as_committed.ipynb")
    recorded = json.loads(source.read_text())["metadata"]["language_info"]["version"]
    open_notebook(page, server, "as_committed.ipynb")
    page.wait_for_timeout(2000)  # the kernel's info arrives after it is idle; JupyterLab applies it then
    dirty = page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() > 0
    close_notebook(page, server, "as_committed.ipynb", settle_s=1)
    running = platform.python_version()
    assert dirty == (running != recorded), (f"the notebooks record Python {recorded}, the kernel runs {running}: "
                                            f"the tab was {'dirty' if dirty else 'clean'} on open")


def test_the_harness_reports_a_failing_cell_and_a_failing_panel(lab):
    """The checks above can fail: Run All stops at a cell that raises (the cells after it left unrun) and the
    saved notebook names its error; a panel whose callback raises is named with its error, its figure unchanged;
    a figure wider than its output area, with its legend over its title and a note off its axis, is named."""
    server, page = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in PLANTED])
    nb.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(nb, server.root / "planted.ipynb")
    seen = drive(server, page, "planted.ipynb", screenshot=False)
    assert seen["errors"] and seen["errors"][0].startswith("ZeroDivisionError"), seen["errors"]
    assert [p.strip() for p in seen["run"]["prompts"]] == ["[1]:", "[2]:", "[3]:", "[4]:", "[ ]:"], seen["run"]
    assert not seen["problems"], seen["problems"]
    for width in (1400, 1024):
        planted = [p for p in seen["layout"] if p.startswith(f"at {width} px: Planted")]
        assert any("px wide in a" in p for p in planted), seen["layout"]
        assert any("legend covers its title" in p for p in planted), seen["layout"]
        assert any("'off its axis'" in p and "far outside the data" in p for p in planted), seen["layout"]
        assert any(p.startswith(f"at {width} px: a control's label is cut: 'k, a label far") for p in seen["layout"])
    (panel,) = seen["panels"]
    assert panel["title"] == "Broken on purpose"
    assert panel["error"] and "planted failure at k=2" in panel["error"], panel
    assert panel["changed_ms"] is None
