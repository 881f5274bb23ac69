"""Test-session setup: every launch of this session (tests and the notebooks they run) makes its run
directories under one root of its own, so the no-orphans checks see this session's processes only."""

import os
import subprocess

import pytest
import torch

from labtools.parallel.launcher import RUN_ROOT_ENV

if not torch.cuda.is_available():  # Triton's interpreter, set before anything imports Triton (torch.compile does):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # labtools.kernels needs it from the start


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


# make test (tests/suite.py) runs the unit tests marked `ranks` first, then the rest beside the lessons that count
# the loopback interface's bytes (their claims would count another process's ranks too). In that second part
# (LABTOOLS_NO_RANKS set) a test that starts ranks without the mark fails here, naming the mark it needs.
NO_RANKS_ENV = "LABTOOLS_NO_RANKS"
LAUNCHERS = ("labtools.parallel.supervise", "torch.distributed.run")


@pytest.fixture(autouse=True)
def ranks_only_where_marked(request, monkeypatch):
    if not os.environ.get(NO_RANKS_ENV) or request.node.get_closest_marker("ranks"):
        yield
        return
    start, refused = subprocess.Popen.__init__, []

    def refuse_ranks(self, args, *rest, **kwargs):
        words = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
        if any(launcher in words for launcher in LAUNCHERS):
            refused.append(words)
            raise RuntimeError(f"{request.node.nodeid} starts ranks: mark it @pytest.mark.ranks")
        start(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_ranks)
    yield
    if refused:  # even where the test caught the error: it did not test what it says
        pytest.fail(f"{request.node.nodeid} starts ranks: mark it @pytest.mark.ranks, so that make test runs it "
                    "before the lessons that count the loopback interface's bytes", pytrace=False)
