"""The launcher, on CPU with gloo ranks: results, failures named by rank and signal, hangs, timeouts,
interrupts, the caller's death, leftovers, bad input — and never a process left behind."""

import _thread
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from labtools.parallel import RankFailed, RunTimedOut, checks, launch
from labtools.parallel.checks import Fault
from labtools.parallel.processes import RUN_DIR_ENV

pytestmark = pytest.mark.ranks  # every test here starts ranks


def processes_under(root: Path) -> list[str]:
    """Processes of this session's runs: their command line names a path under root, or their environment a run
    directory under it (what a rank started inherits that)."""
    out, marker = [], f"{RUN_DIR_ENV}={root}".encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                env = (p / "environ").read_bytes()
            except OSError:
                continue
            if str(root) in cmd or marker in env:
                out.append(f"{p.name}: {cmd}")
    return out


def wait_gone(root: Path, seconds: float = 10.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while processes_under(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_under(root)


@pytest.fixture(autouse=True)
def no_orphans(session_run_root):
    # a launch returns once every result is in, and its processes exit in the background: an earlier test's may
    # still be on their way out (the lessons' tests that launch run just before this file)
    assert wait_gone(session_run_root) == [], "an earlier launch left processes behind"
    yield
    assert wait_gone(session_run_root) == [], "a launch left processes behind"
    deadline = time.monotonic() + 5  # a successful launch removes its directory once its processes exited
    while list(session_run_root.glob("labtools-run-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(session_run_root.glob("labtools-run-*")) == [], "a launch left its run directory behind"


def test_results_come_back_in_rank_order_with_backend():
    results = launch(checks.hello, 3, show_progress=False)
    assert all(isinstance(r, checks.Hello) for r in results)
    assert [d.rank for d in results.dist] == [0, 1, 2]
    assert all(r.sum == 3.0 for r in results)
    assert all(d.backend == "gloo" and d.device == "cpu" and d.world_size == 3 for d in results.dist)
    assert all(r.threads == 1 for r in results)
    assert len({r.pid for r in results}) == 3
    assert len({d.run_id for d in results.dist}) == 1


def test_a_failing_rank_is_named_with_its_traceback_within_seconds():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch(checks.fail_on, 2, Fault(rank=1), show_progress=False)
    assert err.value.rank == 1 and err.value.signal is None
    assert "deliberate failure on rank 1" in str(err.value) and "Traceback" in err.value.traceback
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_is_named_with_its_signal(victim):
    """The peer then fails with 'connection closed'; the cause is the rank with no error of its own."""
    with pytest.raises(RankFailed) as err:
        launch(checks.killed, 2, Fault(rank=victim), show_progress=False)
    assert err.value.rank == victim and err.value.signal == "SIGKILL", str(err.value)
    assert "SIGKILL" in str(err.value)


def test_a_hung_collective_hits_the_process_group_timeout():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch(checks.one_sided, 2, Fault(sleep_s=120), collective_timeout_s=3, show_progress=False)
    assert err.value.rank == 0  # the rank waiting in the collective
    assert time.monotonic() - t0 < 30


def test_ranks_finishing_further_apart_than_the_collective_timeout_still_return():
    results = launch(checks.finish_apart, 2, Fault(rank=1, sleep_s=4), collective_timeout_s=2, show_progress=False)
    assert [r.rank for r in results] == [0, 1]


def test_overall_timeout_stops_every_process():
    with pytest.raises(TimeoutError, match="timeout_s"):
        launch(checks.slow, 2, Fault(steps=100, step_s=1.0), timeout_s=6, show_progress=False)


def test_a_timed_out_run_says_so_and_ends_what_its_ranks_started():
    with pytest.raises(RunTimedOut, match="timeout_s=6") as e:
        launch(checks.starts_a_process, 2, Fault(rank=1, steps=0, sleep_s=300), timeout_s=6, show_progress=False)
    assert e.value.seconds == 6 and e.value.where == {}  # no learner's function ran: no line to name


def test_processes_a_rank_starts_end_with_a_successful_run():
    children = [c.pid for c in launch(checks.starts_a_process, 2, Fault(sleep_s=300), show_progress=False)]
    assert len(set(children)) == 2
    # no_orphans: the children, which name no run directory in their command line, are found by their environment


def test_keyboard_interrupt_stops_every_process():
    # a test run started in the background (`cmd &`, nohup) inherits SIGINT ignored: interrupt_main would do nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(6.0, _thread.interrupt_main)  # as when the notebook's Stop button is pressed
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(checks.slow, 2, Fault(steps=100, step_s=1.0), show_progress=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def test_a_cancelled_launch_stops_every_process():
    from labtools.progress import Cancelled, cancel_on
    cancel = threading.Event()
    timer = threading.Timer(4.0, cancel.set)  # as when a panel's Cancel button is pressed
    timer.start()
    try:
        with cancel_on(cancel), pytest.raises(Cancelled):
            launch(checks.slow, 2, Fault(steps=100, step_s=1.0), show_progress=False)
    finally:
        timer.cancel()  # no_orphans: nothing of the run is left


CALLER = """
import signal, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, even when the tests run under nohup
from labtools.parallel import launch
from labtools.parallel.checks import Fault, slow
launch(slow, 2, Fault(steps=600, step_s=0.1), show_progress=False)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_the_callers_death_leaves_nothing_behind(sig, tmp_path):
    """A closed terminal, a CI timeout, the OOM killer: torchrun and every rank are gone within 10 s."""
    root = tmp_path / "runs"
    root.mkdir()
    env = dict(os.environ, LABTOOLS_RUN_ROOT=str(root))
    caller = subprocess.Popen([sys.executable, "-c", CALLER], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(root.glob("labtools-run-*/pids/*.pid"))) < 2:  # both ranks are running
            assert caller.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.1)
        assert len(processes_under(root)) >= 4  # supervisor, torchrun, two ranks
        caller.send_signal(sig)
        caller.wait(timeout=10)
        assert wait_gone(root, 10) == []
        time.sleep(0.5)
        assert list(root.iterdir()) == [], "the run directory was left behind"
    finally:
        if caller.poll() is None:
            caller.kill()


def test_a_caller_exiting_right_after_a_launch_leaves_nothing_behind(tmp_path):
    """A caller that exits just after a launch returned (its ranks still tearing down in the background): the
    supervisor, losing its parent, stops what is left and removes the run directory."""
    root = tmp_path / "runs"
    root.mkdir()
    code = "from labtools.parallel import launch, checks; print(len(launch(checks.hello, 2, show_progress=False)))"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LABTOOLS_RUN_ROOT=str(root)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr[-2000:]
    assert wait_gone(root, 10) == []
    deadline = time.monotonic() + 10
    while list(root.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(root.iterdir()) == [], "the run directory was left behind"


def test_a_launch_leaves_no_temp_directories(tmp_path):
    """torchrun's torchelastic_* directories go under the run directory, which is removed."""
    before = set(Path(tempfile.gettempdir()).iterdir())
    launch(checks.hello, 2, show_progress=False)
    assert wait_gone(Path(os.environ["LABTOOLS_RUN_ROOT"])) == []
    time.sleep(0.5)
    new = [p.name for p in set(Path(tempfile.gettempdir()).iterdir()) - before
           if p.name.startswith(("torchelastic_", "labtools-run-"))]
    assert new == []


def test_consecutive_ddp_launches_all_succeed():
    """DDP ranks used to abort at exit now and then ('terminate called without an active exception'); every other
    DDP launch of the suite (lessons 07, 08, 11, 12, the rank tests) would fail on it too."""
    for i in range(2):
        results = launch(checks.ddp_tiny, 2, show_progress=False)
        assert results[0].grad_norm == results[1].grad_norm > 0, f"launch {i}"


def _notebook_function():
    return {}


def _closure():
    def inner() -> dict:
        return {}
    return inner


@dataclass(frozen=True)
class NotAConfig:
    x: int = 1


_notebook_function.__module__ = "__main__"


@pytest.mark.parametrize("args, kwargs, match", [
    ((checks.hello, 0), {}, "nprocs"),
    ((checks.hello, 1.5), {}, "nprocs"),
    ((checks.hello, 10**6), {}, "nprocs"),
    ((lambda: {}, 2), {}, "lambda"),
    ((_closure(), 2), {}, "closure"),
    ((_notebook_function, 2), {}, "notebook"),
    ((checks.hello, 2, Fault()), {}, "takes no config"),
    ((checks.fail_on, 2, {"rank": 1}), {}, "must be a Fault"),
    ((checks.fail_on, 2, NotAConfig()), {}, "must be a Fault"),
    ((json.dumps, 2), {}, "module-level function|outside"),
    ((checks.hello, 2), {"backend": "mpi"}, "backend"),
    ((checks.hello, 2), {"timeout_s": 0}, "timeout_s"),
])
def test_bad_input_is_rejected_before_any_process_starts(args, kwargs, match, monkeypatch):
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match=match):
        launch(*args, **kwargs, show_progress=False)
    assert started == []


def test_targets_outside_the_lab_need_an_explicit_allowance(monkeypatch):
    from labtools.parallel.targets import resolve_target
    with pytest.raises(ValueError, match="outside the lab's packages"):
        resolve_target("json:dumps")
    monkeypatch.setenv("LABTOOLS_ALLOW_TARGETS", "json")
    assert resolve_target("json:dumps")[1] is json.dumps


def run_cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "labtools.parallel", *args], capture_output=True, text=True,
                          check=check)


def test_the_readme_multi_node_commands_on_one_node(tmp_path):
    """make-job, torchrun with an explicit c10d rendezvous (as on several nodes), collect."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    job = run_cli("make-job", "labtools.parallel.checks:hello", "--run-dir", str(run),
                  "--backend", "gloo").stdout.strip()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                    "--node-rank", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m",
                    "labtools.parallel.worker", job], check=True, capture_output=True, timeout=120)
    results = json.loads(run_cli("collect", str(run)).stdout)
    assert [r["dist"]["rank"] for r in results] == [0, 1] and all(r["result"]["sum"] == 1.0 for r in results)

    # a used run directory is refused, then cleared only on request; collect never mixes two runs
    refused = run_cli("make-job", "labtools.parallel.checks:hello", "--run-dir", str(run), check=False)
    assert refused.returncode != 0 and "not empty" in refused.stderr
    stale = json.loads((run / "rank1.json").read_text())
    run_cli("make-job", "labtools.parallel.checks:ring_parity", '{"sizes": [3]}', "--run-dir", str(run), "--force")
    assert not (run / "rank0.json").exists()
    (run / "rank1.json").write_text(json.dumps(stale))  # a result of the earlier run, planted
    mixed = run_cli("collect", str(run), check=False)
    assert mixed.returncode != 0 and "another run" in mixed.stderr


def test_make_job_validates_the_config_before_any_node_runs(tmp_path):
    bad = run_cli("make-job", "labtools.parallel.checks:fail_on", '{"rank": "one", "nope": 1}', "--run-dir",
                  str(tmp_path / "r"), check=False)
    assert bad.returncode != 0 and "nope" in bad.stderr
    outside = run_cli("make-job", "os:getcwd", "--run-dir", str(tmp_path / "r2"), check=False)
    assert outside.returncode != 0 and "outside the lab's packages" in outside.stderr


# --- elastic runs (launch(..., max_restarts=k)) -------------------------------------------------------------------

def test_an_elastic_run_with_a_killed_rank_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path):
    """Rank 1 SIGKILLs itself mid-run; torchrun restarts both ranks, which resume from the newest checkpoint.
    The failed attempt's error file (rank 0's "connection reset") must not fail the run that then succeeded."""
    import shutil

    from lessons.fault_tolerance.ranks import ElasticJob, elastic
    job = dict(n_layer=1, n_embd=32, block_size=32, batch_size=4, steps=10, every=3)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    whole = launch(elastic, 2, ElasticJob(**job, directory=str(tmp_path / "a")), show_progress=False)
    killed = launch(elastic, 2, ElasticJob(**job, directory=str(tmp_path / "b"), kill_at=7), max_restarts=1,
                    show_progress=False, keep_dir=True)
    run_dirs = list(Path(os.environ["LABTOOLS_RUN_ROOT"]).glob("labtools-run-*"))
    try:
        assert [r.restarts for r in killed] == [1, 1] and killed.dist[0].restarts == 1
        assert killed[0].resumed_from == 6
        assert killed[0].digest == whole[0].digest and killed[0].losses == whole[0].losses
        assert any(d.glob("rank*.attempt0.error.json") for d in run_dirs), "the first attempt left no error file"
    finally:
        assert wait_gone(Path(os.environ["LABTOOLS_RUN_ROOT"])) == []
        for d in run_dirs:
            shutil.rmtree(d)


def test_an_elastic_run_that_keeps_failing_names_the_rank_of_its_last_attempt():
    with pytest.raises(RankFailed, match="rank 1 failed: ValueError: deliberate failure on rank 1"):
        launch(checks.fail_on, 2, Fault(rank=1), max_restarts=1, show_progress=False)


@pytest.mark.parametrize("value", [-1, 1.5, True, 101])
def test_max_restarts_is_validated(value):
    with pytest.raises(ValueError, match="max_restarts"):
        launch(checks.hello, 2, max_restarts=value, show_progress=False)


def test_a_config_field_of_the_wrong_type_is_named_before_any_process_starts(session_run_root):
    with pytest.raises(ValueError, match=r"Fault.rank must be int, got str 'one'"):
        launch(checks.fail_on, 2, Fault(rank="one"), show_progress=False)
    assert list(session_run_root.glob("labtools-run-*")) == []


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_that_exits_with_a_code_is_named_not_the_peer_it_left_waiting(victim):
    with pytest.raises(RankFailed) as info:
        launch(checks.exits, 2, Fault(rank=victim, code=3), show_progress=False, collective_timeout_s=20)
    assert info.value.rank == victim and "exited with code 3" in str(info.value)


def test_a_rank_that_aborts_is_named_as_aborting_itself():
    with pytest.raises(RankFailed) as info:
        launch(checks.aborts, 2, Fault(rank=1), show_progress=False, collective_timeout_s=20)
    assert info.value.rank == 1 and info.value.signal == "SIGABRT" and "aborted itself" in str(info.value)


def test_a_rank_that_exits_0_without_a_result_is_a_rank_failure_naming_it():
    with pytest.raises(RankFailed) as info:
        launch(checks.exits, 2, Fault(rank=1, code=0), show_progress=False)
    assert info.value.rank == 1 and "without a result" in str(info.value)


def test_the_local_agent_words_failures_as_torchrun_does():
    """labtools.parallel.local replaces torchrun's agent for runs that do not restart: diagnose reads its summary
    with the same parser, the first failure as the root cause and a SIGTERM'd peer as a consequence."""
    from labtools.parallel.diagnose import root_cause, torchrun_failures
    from labtools.parallel.local import rank_env, summary
    text = summary([(1, -6, time.time()), (0, -15, time.time())])
    assert torchrun_failures(text) == {1: -6, 0: -15} and root_cause(text) == 1
    env = rank_env(2, 4, 29555)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "2", "4", "29555")
