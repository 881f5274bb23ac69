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

Each rank is tied to this process (SIGKILL when it dies), as this process is to the supervisor.

CPU (gloo) ranks are forked from this process, not started afresh: it imports torch and the job's rank function
once, then forks each rank, which sets torchrun's environment and runs labtools.parallel.worker's main. Importing
torch costs every fresh rank 2.5-3.5 CPU-seconds here, the seconds a whole launch of two ranks takes to reach a
barrier (measured: 2.6 s and 5.1 CPU-s for two ranks, 5.7 s and 10.8 CPU-s for four, started afresh). A fork is safe
here: with one OpenMP thread per rank, the import starts no thread (checked: one thread in /proc/self/task), and
nothing has touched a device. GPU (NCCL) ranks and any other command start as new processes.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

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


class Forked:
    """A rank forked from this process, with the part of subprocess.Popen's interface this module uses."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N for a signal, as Popen says it
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def worker_job(cmd: list[str]) -> str | None:
    """The job file, where cmd is `PYTHON -m labtools.parallel.worker JOB` for CPU ranks (None: start cmd afresh)."""
    if len(cmd) != 4 or cmd[1:3] != ["-m", "labtools.parallel.worker"]:
        return None
    try:
        backend = json.loads(open(cmd[3]).read())["backend"]
    except (OSError, ValueError, KeyError):
        return None  # the worker says what is wrong with it
    return cmd[3] if backend == "gloo" else None


def fork_ranks(job: str, nprocs: int, port: int, preexec) -> list[Forked]:
    """Import what every rank imports, once, then fork the ranks: each takes torchrun's environment and runs the
    worker's main, and never returns here."""
    from labtools.parallel import worker
    try:  # the rank function's module too; where it fails, each rank fails on it and reports it
        from labtools.parallel.targets import resolve_target
        resolve_target(json.loads(open(job).read())["target"])
    except BaseException:  # noqa: BLE001
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    procs = []
    for r in range(nprocs):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a new process has it: SIGTERM ends the rank
                if preexec is not None:
                    preexec()
                os.environ.update(rank_env(r, nprocs, port))  # this process's environment, and torchrun's words
                code = worker.main(job)
            except BaseException:  # noqa: BLE001 - a rank never returns into this loop
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        procs.append(Forked(pid))
    return procs


def _stop(procs: list) -> None:
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
    job = worker_job(cmd)
    if job is not None:
        procs = fork_ranks(job, nprocs, port, preexec)
    else:
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
