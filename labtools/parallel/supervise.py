"""A run's ranks (labtools.parallel.local, or torchrun), tied to the process that launched it.
labtools.parallel.launch starts this, not you:

    $ python -m labtools.parallel.supervise PARENT_PID RUN_DIR -- python -m torch.distributed.run ...

When the launching process dies — whatever killed it, SIGKILL included — the kernel sends this process
SIGTERM (PR_SET_PDEATHSIG). It then stops its child, the agent that started the ranks (SIGTERM, SIGKILL after a
grace period) and, as nobody else will, removes the run directory. The agent is tied to this process with SIGKILL
the same way, and each rank to the agent (labtools/parallel/worker.py), so no process of a run can outlive the one
that started it.
Imports no torch: it must start fast and stay small.
"""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from labtools.parallel.processes import run_processes

GRACE_S = 5.0
PR_SET_PDEATHSIG = 1


def tie_to_parent(sig: int, parent: int) -> None:
    """Receive `sig` when the parent dies (Linux); elsewhere a thread polls for it. Exits at once if the
    parent is already gone (it died before the tie took effect)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    else:
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), sig)
        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def _wait_for_ranks(run_dir: Path) -> None:
    """Wait (up to GRACE_S) until no rank recorded in run_dir/pids is alive, so nothing writes into a removed
    directory."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        alive = []
        for f in (run_dir / "pids").glob("*.pid"):
            try:
                alive.append(str(run_dir) in Path(f"/proc/{int(f.read_text())}/cmdline").read_text(errors="replace"))
            except (OSError, ValueError):
                pass
        if not any(alive):
            return
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    parent, run_dir = int(argv[0]), Path(argv[1])
    if argv[2] != "--":
        raise SystemExit("usage: python -m labtools.parallel.supervise PARENT_PID RUN_DIR -- COMMAND...")
    cmd = argv[3:]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: stop.set())
    tie_to_parent(signal.SIGTERM, parent)
    preexec = None
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before fork: the child only calls it
        preexec = lambda: libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # noqa: E731 - single-threaded here
    child = subprocess.Popen(cmd, preexec_fn=preexec)
    while child.poll() is None and not stop.is_set():
        stop.wait(0.1)
    if child.poll() is None:  # asked to stop, or the parent died
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()  # the ranks follow (their parent-death signal)
            child.wait()
    if os.getppid() != parent:
        _wait_for_ranks(run_dir)
        for pid in run_processes(run_dir):  # what the ranks started, which no one else will stop now
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(run_dir, ignore_errors=True)
    return child.returncode if not stop.is_set() else 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
