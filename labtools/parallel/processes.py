"""The processes of a run: which are still alive and ours, stopping them, and the teardown after a good run.

A run's ranks write their PIDs to RUN/pids/; a PID counts as the run's only while its command line names the
run directory (a recycled PID is never killed). Every process of a run, and every process a rank starts, inherits
LABTOOLS_RUN_DIR=RUN in its environment: that finds what the ranks started (a learner's subprocess, say) when the
run ends. After a successful run, the ranks and torchrun exit in the
background (a reaper thread); a caller that exits right after a launch waits for that teardown at exit.
"""

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

RUN_DIR_ENV = "LABTOOLS_RUN_DIR"  # the run directory, in the environment of every process of the run
_REAPERS: set[threading.Thread] = set()
_EXITING = threading.Event()


def _reap(proc: subprocess.Popen, run_dir: Path, log, keep_dir: bool, grace_s: float = 30.0,
          exit_grace_s: float = 5.0) -> None:
    """After a successful run: wait for its processes to exit (teardown), stop them if they do not, clean up.
    If the launching process exits first, _finish_reaping (atexit) lets this finish, with a shorter grace; if it
    dies (a signal), the supervisor's parent-death signal does the same."""
    try:
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            if _EXITING.is_set():
                deadline = min(deadline, time.monotonic() + exit_grace_s)
            time.sleep(0.05)
        if proc.poll() is None or run_processes(run_dir):
            terminate(proc, run_dir)
        log.close()
        if not keep_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        _REAPERS.discard(threading.current_thread())


def start_reaping(*args) -> None:
    thread = threading.Thread(target=_reap, args=args, daemon=True)
    _REAPERS.add(thread)
    thread.start()


@atexit.register
def _finish_reaping(timeout_s: float = 30.0) -> None:
    """A caller that exits right after a launch: finish the background teardown (which removes the run directory)
    instead of dying in the middle of it. Without this, a supervisor whose torchrun ended just before the caller
    exited leaves the directory to a daemon thread that the interpreter stops."""
    _EXITING.set()
    deadline = time.monotonic() + timeout_s
    for thread in list(_REAPERS):
        thread.join(max(0.0, deadline - time.monotonic()))


def _pid_of_this_run(pid: int, run_dir: Path) -> bool:
    """Is pid alive and one of this run's processes (its command line names the run's job file)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(run_dir) in cmdline


def run_pids(run_dir: Path) -> list[int]:
    """PIDs the ranks of a run recorded, still alive and still theirs."""
    pids = []
    for f in sorted((run_dir / "pids").glob("*.pid")):
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        if _pid_of_this_run(pid, run_dir):
            pids.append(pid)
    return pids


def run_processes(run_dir: Path) -> list[int]:
    """Every live process of the run: its ranks, and anything whose environment names the run directory (the
    supervisor, torchrun, and what the ranks started, which inherits it). Never this process."""
    marker = f"{RUN_DIR_ENV}={run_dir}".encode() + b"\0"
    pids = set(run_pids(run_dir))
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "environ").read_bytes():
                    pids.add(int(d.name))
            except OSError:  # gone, or not ours to read
                continue
    return sorted(pids)


def terminate(proc: subprocess.Popen, run_dir: Path, grace_s: float = 5.0) -> None:
    """Stop the supervisor (it stops torchrun, which stops its ranks), then SIGKILL what of this run is left,
    processes the ranks started included."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=2 * grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + grace_s
    while run_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in run_processes(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
