"""What a finished run left: each rank's result, or the root cause of its failure, named by rank (and signal)."""

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path


class RankFailed(RuntimeError):
    """A rank failed: .rank, .error, .traceback and .logs (the rank's captured output) say where and why.
    .signal is the signal's name when the rank was killed by one."""

    def __init__(self, rank: int, error: str, traceback: str = "", logs: str = "", signal_name: str | None = None):
        detail = f"\n\n--- traceback of rank {rank} ---\n{traceback}" if traceback else ""
        if logs and not traceback:
            detail = f"\n\n--- last output of rank {rank} ---\n" + "\n".join(logs.splitlines()[-8:])
        super().__init__(f"rank {rank} failed: {error}{detail}")
        self.rank, self.error, self.traceback, self.logs, self.signal = rank, error, traceback, logs, signal_name



@dataclass(frozen=True)
class DistInfo:
    """Where and how a rank ran, as its worker recorded it."""
    rank: int
    world_size: int
    backend: str
    device: str
    seconds: float      # the rank function's own time
    run_id: str | None = None
    restarts: int = 0   # torchrun's restarts before the attempt that produced the result


class RunTimedOut(TimeoutError):
    """A launch ran past its time bound and was stopped. `.where[r]` is the last line rank r was on in a file whose
    name starts with `<your` (a learner's function: labtools.learner.load_function compiles it so), as
    (file name, line number), where its stack showed one."""

    def __init__(self, message: str, where: dict[int, tuple[str, int]], seconds: float):
        super().__init__(message)
        self.where, self.seconds = where, seconds


_FRAME = re.compile(r'File "(<your [^"]*>)", line (\d+)')


def learner_lines(run_dir: Path, nprocs: int) -> dict[int, tuple[str, int]]:
    """Per rank, the innermost frame in a learner's function in the stacks its log holds (faulthandler prints the
    most recent call first)."""
    out = {}
    for r in range(nprocs):
        m = _FRAME.search(_last_dump(run_dir, r))
        if m:
            out[r] = (m.group(1), int(m.group(2)))
    return out


def _last_dump(run_dir: Path, r: int) -> str:
    log = _rank_log(run_dir, r)
    i = log.rfind("Current thread")
    return log[i:] if i >= 0 else ""


class Ranks(list):
    """Each rank's result, in rank order, typed as the rank function's return annotation; `.dist[r]` says where and
    how rank r ran (its DistInfo)."""

    def __init__(self, results, dist: list[DistInfo]):
        super().__init__(results)
        self.dist = dist


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")

def all_results(run_dir: Path, nprocs: int) -> bool:
    return all((run_dir / f"rank{r}.json").exists() for r in range(nprocs))


def torchrun_failures(log: str) -> dict[int, int]:
    """{rank: exit code} of the failures torchrun reported (a negative code is the signal that killed it)."""
    return {int(r): int(code) for r, code in _FAILURE.findall(log)}


_ROOT = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)


def root_cause(log: str) -> int | None:
    """The rank torchrun names as the first observed failure, if its summary is in the log."""
    m = _ROOT.search(log)
    return int(m.group(1)) if m else None


_NO_RESULT = ("exited with code 0 without a result: the rank function did not return (sys.exit or os._exit in it, or "
              "a process it started ended it)")


def _how(code: int) -> str:
    """How a rank ended, from its exit code (negative: the signal), said plainly."""
    if code == -signal.SIGABRT:
        return ("aborted itself (SIGABRT, no Python error: a library's fatal error, e.g. in the communication "
                "backend; its last output below says which)")
    if code < 0:
        return (f"killed by {_signal_name(code)} (no Python error: the process was killed from outside, e.g. by the "
                "OOM killer or a kill command)")
    return f"exited with code {code} without a Python error (os._exit or sys.exit in the rank function, or a crash)"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _read_errors(run_dir: Path) -> list[dict]:
    errors = []
    for f in run_dir.glob("rank*.error.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return errors


def _rank_log(run_dir: Path, rank: int) -> str:
    f = run_dir / f"rank{rank}.log"
    return f.read_text(errors="replace") if f.exists() else ""


def diagnose(run_dir: Path, nprocs: int, returncode: int | None) -> RankFailed | RuntimeError | None:
    """The root cause of a failed run, or None if it succeeded.

    A rank that ended without a Python error and without a result (killed by a signal other than torchrun's own
    SIGTERM, aborted, or exited with a code) is the cause: its peers then fail with "connection closed"; torchrun's
    first observed failure decides between several. Else a rank that exited 0 with nothing written while others
    failed; else the first Python error any rank recorded (later ones are consequences); else what torchrun
    reported; else a rank that exited 0 without its result.
    """
    errors = _read_errors(run_dir)
    if returncode == 0 and all_results(run_dir, nprocs):
        return None  # errors of earlier attempts (an elastic run that restarted) are not this run's failure
    last = max([e.get("attempt", 0) for e in errors], default=0)
    errors = [e for e in errors if e.get("attempt", 0) == last]  # the attempt that ended the run
    log = (run_dir / "torchrun.log").read_text(errors="replace") if (run_dir / "torchrun.log").exists() else ""
    failures = torchrun_failures(log)
    with_error = {e["rank"] for e in errors}
    # a rank that ended without a Python error of its own and without a result is the cause: its peers then fail
    # with "connection closed" (errors of their own, but consequences). torchrun's SIGTERM is its stopping the rest.
    silent = {r: code for r, code in failures.items() if r not in with_error and code != -signal.SIGTERM
              and not (run_dir / f"rank{r}.json").exists()}
    if silent:
        r = root_cause(log) if root_cause(log) in silent else min(silent)
        return RankFailed(r, _how(silent[r]), logs=_rank_log(run_dir, r),
                          signal_name=_signal_name(silent[r]) if silent[r] < 0 else None)
    # a rank that exited 0 with neither a result nor an error, while its peers failed waiting for it
    vanished = [r for r in range(nprocs) if r not in failures and r not in with_error
                and not (run_dir / f"rank{r}.json").exists()]
    if vanished and errors:
        return RankFailed(vanished[0], _NO_RESULT, logs=_rank_log(run_dir, vanished[0]))
    if errors:
        first = min(errors, key=lambda e: e["time"])
        return RankFailed(first["rank"], first["error"], first["traceback"], _rank_log(run_dir, first["rank"]))
    if failures:
        r = min(failures)
        return RankFailed(r, _how(failures[r]), logs=_rank_log(run_dir, r),
                          signal_name=_signal_name(failures[r]) if failures[r] < 0 else None)
    missing = [r for r in range(nprocs) if not (run_dir / f"rank{r}.json").exists()]
    if returncode == 0 and missing:
        return RankFailed(missing[0], _NO_RESULT, logs=_rank_log(run_dir, missing[0]))
    return RuntimeError(f"torchrun exited with code {returncode} and no rank reported a failure.\n"
                        + log_tails(run_dir, nprocs))


def log_tails(run_dir: Path, nprocs: int) -> str:
    tails = [f"--- rank {r} ---\n" + "\n".join(_rank_log(run_dir, r).splitlines()[-5:]) for r in range(nprocs)
             if (run_dir / f"rank{r}.log").exists()]
    torchrun = (run_dir / "torchrun.log").read_text(errors="replace") if (run_dir / "torchrun.log").exists() else ""
    return "\n".join(tails + ["--- torchrun ---", *torchrun.splitlines()[-12:]])


def read_results(run_dir: Path, nprocs: int | None = None) -> list[dict]:
    """Each rank's {"result": ..., "dist": ...} of the run whose job.json is in run_dir, in rank order — all from
    that one run.

    Refuses results of another run (a different run id), a missing rank, or a world size that disagrees.
    """
    job = json.loads((run_dir / "job.json").read_text())
    results = {}
    for f in run_dir.glob("rank*.json"):
        if f.name.endswith(".error.json"):
            continue
        r = json.loads(f.read_text())
        if r.get("dist", {}).get("run_id") != job["run_id"]:
            raise RuntimeError(f"{f} belongs to another run than {run_dir / 'job.json'}")
        results[r["dist"]["rank"]] = r
    worlds = {r["dist"]["world_size"] for r in results.values()}
    if len({r["dist"].get("restarts", 0) for r in results.values()}) > 1:
        raise RuntimeError(f"results in {run_dir} come from different attempts of an elastic run")
    if len(worlds) > 1:
        raise RuntimeError(f"results in {run_dir} disagree on the world size: {sorted(worlds)}")
    world = nprocs if nprocs is not None else (worlds.pop() if worlds else 0)
    missing = [r for r in range(world) if r not in results]
    if missing or not world:
        raise RuntimeError(f"rank(s) {missing or 'all'} of {run_dir} finished without writing a result")
    return [results[r] for r in range(world)]
