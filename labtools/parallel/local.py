"""The ranks of a one-machine run, started as torchrun would start them, without its elastic agent.

    $ python -m labtools.parallel.local NPROCS -- python -m labtools.parallel.worker RUN_DIR/job.json

labtools.parallel.launch runs this under its supervisor when a run needs no restart: torchrun's agent imports
torch and rendezvouses before the first rank starts, about 2.5 s of a 5 s launch of two ranks here (measured:
two ranks that only meet at a barrier took 5.0 s under torchrun --standalone, 2.5 s started directly). Each rank
gets the environment torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT), so labtools.parallel.worker cannot tell the difference. As torchrun does, the first
rank to fail stops the others (SIGTERM, then SIGKILL after a grace period), and the failures are written in
torchrun's words to stdout (the run's torchrun.log), so labtools.parallel.diagnose reads them the same way.
A run that restarts a failed group (max_restarts, lesson 11) still runs under torchrun.

Each rank is tied to this process (SIGKILL when it dies), as this process is to the supervisor. Imports no torch.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

GRACE_S = 5.0
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port free on this machine now, for rank 0's store (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, nprocs: int, port: int) -> dict[str, str]:
    """What torchrun --standalone puts in a rank's environment, for one machine and no restart."""
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs), ROLE_WORLD_SIZE=str(nprocs),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
                TORCHELASTIC_MAX_RESTARTS="0")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank still running, then SIGKILL those left after GRACE_S."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def summary(failures: list[tuple[int, int, float]]) -> str:
    """The failures as torchrun's error summary words them: the first observed one, then the others."""
    def entry(i, rank, code, at):
        return (f"[{i}]:\n  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(at))}\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code}\n")
    first, *rest = failures
    return ("Failures:\n" + "".join(entry(i + 1, *f) for i, f in enumerate(rest))
            + "Root Cause (first observed failure):\n" + entry(0, *first))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m labtools.parallel.local NPROCS -- COMMAND...")
    nprocs, cmd = int(argv[0]), argv[2:]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    preexec = None
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before fork: the child only calls it
        preexec = lambda: libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # noqa: E731 - single-threaded here
    port = free_port()
    procs = [subprocess.Popen(cmd, env=rank_env(r, nprocs, port), preexec_fn=preexec) for r in range(nprocs)]
    failures: list[tuple[int, int, float]] = []  # (rank, exit code, when), in the order they were seen
    while not stop.is_set() and any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0) and all(f[0] != r for f in failures):
                failures.append((r, p.returncode, time.time()))
        if failures:
            break
        stop.wait(0.02)
    _stop(procs)  # a failure, or the supervisor asked: the others go too (at once if they are done)
    for r, p in enumerate(procs):
        if p.returncode != 0 and all(f[0] != r for f in failures):
            failures.append((r, p.returncode, time.time()))
    if failures:
        print(summary(failures), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
