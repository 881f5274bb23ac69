"""The launcher, on CPU with gloo ranks: results, failures, hangs, timeouts, interrupts, no orphans."""

import _thread
import threading
import time
from pathlib import Path

import pytest

from labtools.dist import RankFailed, launch


def leftover_processes() -> list[str]:
    """Processes of any launch still alive (their command lines name a labtools-dist run directory)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "labtools-dist-" in cmd:
                out.append(f"{p.name}: {cmd}")
    return out


@pytest.fixture(autouse=True)
def no_orphans():
    import shutil
    import tempfile
    runs_before = set(Path(tempfile.gettempdir()).glob("labtools-dist-*"))
    assert leftover_processes() == []
    yield
    deadline = time.monotonic() + 5  # give the kernel a moment to reap
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes() == [], "a launch left processes behind"
    for run in set(Path(tempfile.gettempdir()).glob("labtools-dist-*")) - runs_before:  # failed runs keep logs
        shutil.rmtree(run, ignore_errors=True)


def test_results_come_back_in_rank_order_with_backend():
    results = launch("labtools.dist.checks:hello", 3, show_progress=False)
    assert [r["dist"]["rank"] for r in results] == [0, 1, 2]
    assert all(r["sum"] == 3.0 and r["dist"]["backend"] == "gloo" and r["dist"]["device"] == "cpu" for r in results)
    assert all(r["threads"] == 1 for r in results)
    assert len({r["pid"] for r in results}) == 3


def test_a_failing_rank_is_named_with_its_traceback_within_seconds():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch("labtools.dist.checks:fail_on", 2, {"rank": 1}, show_progress=False)
    assert err.value.rank == 1
    assert "deliberate failure on rank 1" in str(err.value) and "Traceback" in err.value.traceback
    assert time.monotonic() - t0 < 30


def test_a_hung_collective_hits_the_process_group_timeout():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch("labtools.dist.checks:one_sided", 2, {"sleep_s": 120}, collective_timeout_s=3, show_progress=False)
    assert err.value.rank == 0  # the rank waiting in the collective
    assert time.monotonic() - t0 < 30


def test_overall_timeout_stops_every_process():
    with pytest.raises(TimeoutError, match="timeout_s"):
        launch("labtools.dist.checks:slow", 2, {"steps": 100, "step_s": 1.0}, timeout_s=6, show_progress=False)


def test_keyboard_interrupt_stops_every_process():
    timer = threading.Timer(6.0, _thread.interrupt_main)  # as when the notebook's Stop button is pressed
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch("labtools.dist.checks:slow", 2, {"steps": 100, "step_s": 1.0}, show_progress=False)
    finally:
        timer.cancel()


@pytest.mark.parametrize("kwargs, match", [
    (dict(target="labtools.dist.checks:hello", nprocs=0), "nprocs"),
    (dict(target="labtools.dist.checks:hello", nprocs=1.5), "nprocs"),
    (dict(target="labtools.dist.checks:nope", nprocs=2), "no function"),
    (dict(target="no_such_module:f", nprocs=2), "cannot be imported"),
    (dict(target="labtools.dist.checks", nprocs=2), "package.module:function"),
    (dict(target="labtools.dist.checks:hello", nprocs=2, config={"x": object()}), "JSON"),
    (dict(target="labtools.dist.checks:hello", nprocs=2, backend="mpi"), "backend"),
])
def test_bad_input_is_rejected_before_any_process_starts(kwargs, match, monkeypatch):
    import subprocess
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match=match):
        launch(**kwargs, show_progress=False)
    assert started == []


def test_twenty_consecutive_ddp_launches_all_succeed():
    for i in range(20):
        results = launch("labtools.dist.checks:ddp_tiny", 2, show_progress=False)
        assert results[0]["grad_norm"] == results[1]["grad_norm"] > 0, f"launch {i}"


def test_the_readme_multi_node_commands_on_one_node(tmp_path):
    """make-job, torchrun with an explicit c10d rendezvous (as on several nodes), collect."""
    import json
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    py = sys.executable
    job = subprocess.run([py, "-m", "labtools.dist", "make-job", "labtools.dist.checks:hello", "{}", "--run-dir",
                          str(run), "--backend", "gloo"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([py, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--node-rank", "0",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "labtools.dist.worker",
                    job],
                   check=True, capture_output=True, timeout=120)
    results = json.loads(subprocess.run([py, "-m", "labtools.dist", "collect", str(run)], check=True,
                                        capture_output=True, text=True).stdout)
    assert [r["dist"]["rank"] for r in results] == [0, 1] and all(r["sum"] == 1.0 for r in results)
