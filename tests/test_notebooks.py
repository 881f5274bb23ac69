"""Every lesson notebook committed clean, its parameters validated first, and papermill at the low edges.
(`make test` executes every notebook with PROFILE="smoke" in JupyterLab and a real browser: test_browser.py.)"""

import json
from pathlib import Path

import nbformat
import papermill as pm
import pytest
from jupyter_browser import KERNELSPEC

from labtools.claims import read_ledgers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_is_clean(path):
    ids = [cell.get("id") for cell in json.loads(path.read_text())["cells"]]  # as committed: nbformat would invent
    assert all(ids) and len(set(ids)) == len(ids), "every cell needs its own id"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    # the metadata JupyterLab writes, the same in every notebook, so that a notebook opens without an unsaved change
    # (tests/test_browser.py opens one as committed); language_info comes from the kernel of the Python recorded
    first = json.loads(NOTEBOOKS[0].read_text())["metadata"]
    assert nb.metadata["kernelspec"] == KERNELSPEC
    assert nb.metadata == first and {"name", "version", "mimetype", "file_extension"} <= set(first["language_info"])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "committed notebook carries outputs"
    params = code[1]
    assert "parameters" in params.metadata.get("tags", []), "the second code cell must be tagged 'parameters'"
    assert params.source.splitlines()[0].startswith('PROFILE = "auto"')
    assert not any(line.lstrip().startswith("!") for c in code for line in c.source.splitlines()), "no ! cells"


def execute(path: Path, out: Path, **parameters) -> dict:
    pm.execute_notebook(str(path), str(out), parameters=parameters, cwd=str(path.parent), kernel_name="python3",
                        progress_bar=False, log_output=False, iopub_timeout=120)  # 4 s fails on a busy host
    return json.loads(out.read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_validates_its_parameters_before_any_work(path):
    """The cells before the parameters only import; the cell right after them builds the validated settings
    (lesson.settings(PROFILE, ...)), so an unknown profile or an out-of-range value stops the notebook there,
    before any heavy work. (That settings() rejects them is tested for every lesson in test_edges.py.)"""
    import ast
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for node in ast.parse(code[0].source).body:
        assert isinstance(node, (ast.Import, ast.ImportFrom)), f"the first code cell does more than import: {node}"
    settings = code[2].source
    assert settings.lstrip().startswith("S = lesson.settings(PROFILE"), "the cell after the parameters must validate"
    params = [n.targets[0].id for n in ast.parse(code[1].source).body if isinstance(n, ast.Assign)]
    called = {kw.arg: kw.value.id for kw in ast.parse(settings).body[0].value.keywords}
    assert sorted(called.values()) == sorted(p for p in params if p != "PROFILE"), "every parameter is validated"


@pytest.mark.notebook
def test_a_notebook_runs_at_the_low_edges_of_its_parameters(tmp_path, monkeypatch):
    """Lesson 00 with every parameter at its lowest valid value (STEPS = 10 once failed after 80 s of training,
    in a panel whose slider minimum exceeded its maximum). Claims may not hold at such sizes; errors may not occur."""
    monkeypatch.setenv("LABTOOLS_STATIC", "1")
    path = ROOT / "notebooks" / "00_training_loop.ipynb"
    nb = execute(path, tmp_path / path.name, PROFILE="smoke", STEPS=10, TEXT_STEPS=10, N_LAYER=1, N_EMBD=16, LR=1e-6)
    assert read_ledgers(nb), "the notebook did not reach its ledger"
