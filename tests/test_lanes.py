"""make test's lanes (tests/suite.py): in the unit tests that run beside the lessons that count the loopback
interface's bytes, a test that starts ranks without the `ranks` mark fails, even where it catches the refusal."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = '''
import subprocess
import sys

import pytest

LAUNCH = [sys.executable, "-c", "pass", "labtools.parallel.supervise"]  # a launcher's words, nothing started


@pytest.mark.ranks
def test_marked():
    subprocess.run(LAUNCH, check=True)


def test_unmarked():
    subprocess.run(LAUNCH, check=True)


def test_unmarked_that_catches():
    try:
        subprocess.run(LAUNCH, check=True)
    except RuntimeError:
        pass


def test_no_ranks():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


def outcomes(tmp_path, no_ranks: bool) -> dict[str, str]:
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["ranks: starts ranks"]\n')
    (tmp_path / "test_launches.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "LABTOOLS_NO_RANKS"}
    if no_ranks:
        env["LABTOOLS_NO_RANKS"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout
    seen = {}
    for line in out.splitlines():
        for word in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(word + " ") and "::" in line:
                name = line.split("::")[1].split(" ")[0]
                seen[name] = "failed" if word != "PASSED" or name in seen else "passed"
    return seen


def test_an_unmarked_test_that_starts_ranks_fails_only_where_ranks_are_refused(tmp_path):
    refused = outcomes(tmp_path, no_ranks=True)
    assert refused == {"test_marked": "passed", "test_unmarked": "failed", "test_unmarked_that_catches": "failed",
                       "test_no_ranks": "passed"}, refused
    allowed = outcomes(tmp_path, no_ranks=False)
    assert set(allowed.values()) == {"passed"} and len(allowed) == 4, allowed
