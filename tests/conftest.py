"""Test-session setup: every launch of this session (tests and the notebooks they run) makes its run
directories under one root of its own, so the no-orphans checks see this session's processes only."""

import os

import pytest

from labtools.parallel.launcher import RUN_ROOT_ENV


@pytest.fixture(scope="session", autouse=True)
def session_run_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    old = os.environ.get(RUN_ROOT_ENV)
    os.environ[RUN_ROOT_ENV] = str(root)  # inherited by notebook kernels and their launches
    yield root
    if old is None:
        os.environ.pop(RUN_ROOT_ENV, None)
    else:
        os.environ[RUN_ROOT_ENV] = old
