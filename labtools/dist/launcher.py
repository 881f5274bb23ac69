"""Launch real multi-process runs from Python or a notebook cell, through torchrun.

    from lessons.ranks.data_parallel import equivalence, DPJob
    results = launch(equivalence, nprocs=2, config=DPJob(steps=10))

`launch` takes the rank function itself (a module-level function of the lab's packages; it derives
"module:qualname" and refuses lambdas, closures and functions defined in a notebook) and a config
dataclass, which is sent as JSON and rebuilt, typed and validated, inside each rank from the function's
annotation. It runs

    python -m labtools.dist.supervise PARENT RUN_DIR -- python -m torch.distributed.run --standalone \
        --nproc-per-node N -m labtools.dist.worker RUN_DIR/job.json

Each rank (labtools/dist/worker.py) initialises the process group (NCCL with one GPU per rank when there
are enough GPUs, else gloo on the CPU with one thread per rank), calls `function(config) -> dict`, and
writes the dict; `launch` returns them in rank order, each with a "dist" entry saying rank, world size,
backend and device.

Failure handling (tests/test_dist.py):
- a rank that raises -> RankFailed naming the rank, with its traceback, within seconds;
- a rank killed by a signal (no result, no error of its own) -> RankFailed naming that rank and signal,
  even when its peers then fail with "connection closed";
- a collective that not every rank reaches -> the process-group timeout (collective_timeout_s);
- an overall timeout or a KeyboardInterrupt -> every process of the run is stopped;
- the caller itself dies (SIGTERM, SIGHUP, SIGKILL: a closed terminal, a CI timeout, the OOM killer) ->
  the supervisor gets a parent-death signal and stops torchrun; ranks die with torchrun.
torchrun's own files go under the run directory, which is removed afterwards (keep_dir=True keeps it).
"""

import atexit
import dataclasses
import importlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import typing
import uuid
from pathlib import Path

import torch

from labtools.dist.toolkit import RUN_DIR_ENV
from labtools.progress import progress

BACKENDS = ("auto", "gloo", "nccl")
RUN_ROOT_ENV = "LABTOOLS_RUN_ROOT"          # where run directories are made (default: the temp directory)
ALLOW_ENV = "LABTOOLS_ALLOW_TARGETS"        # extra module prefixes a job may name, comma-separated
TRUSTED_PACKAGES = ("labtools", "lessons")  # a job file is code: by default it may only name these
MAX_GLOO_RANKS = 64                         # CPU ranks on one machine; beyond this a launch is a mistake


class RankFailed(RuntimeError):
    """A rank failed: .rank, .error, .traceback and .logs (the rank's captured output) say where and why.
    .signal is the signal's name when the rank was killed by one."""

    def __init__(self, rank: int, error: str, traceback: str = "", logs: str = "", signal_name: str | None = None):
        detail = f"\n\n--- traceback of rank {rank} ---\n{traceback}" if traceback else ""
        if logs and not traceback:
            detail = f"\n\n--- last output of rank {rank} ---\n" + "\n".join(logs.splitlines()[-8:])
        super().__init__(f"rank {rank} failed: {error}{detail}")
        self.rank, self.error, self.traceback, self.logs, self.signal = rank, error, traceback, logs, signal_name


# --- targets and configs --------------------------------------------------------------------------------------

def allowed_prefixes(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    env = tuple(p.strip() for p in os.environ.get(ALLOW_ENV, "").split(",") if p.strip())
    return TRUSTED_PACKAGES + env + tuple(extra)


def _allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def config_type(fn) -> type | None:
    """The dataclass a rank function takes (from its annotation), or None for a function of no arguments."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return None
    hint = typing.get_type_hints(fn).get(params[0].name) if len(params) == 1 else None
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        raise ValueError(f"rank function {fn.__module__}.{fn.__qualname__} must take no arguments or one argument "
                         "annotated with a dataclass (its config), e.g. `def fn(cfg: MyJob) -> dict`")
    return hint


def target_of(fn, allow: tuple[str, ...] = ()) -> str:
    """'module:qualname' of a rank function, refusing what another process could not import by name."""
    if isinstance(fn, str):
        return _resolve_name(fn, allow)[0]
    if not inspect.isfunction(fn):
        raise ValueError(f"launch takes a module-level function, got {fn!r}")
    where = f"{fn.__module__}.{fn.__qualname__}"
    if fn.__name__ == "<lambda>":
        raise ValueError(f"launch cannot send a lambda ({where}) to other processes: define a function in a module")
    if "<locals>" in fn.__qualname__:
        raise ValueError(f"launch cannot send a closure ({where}) to other processes: define it at module level")
    if fn.__module__ in (None, "__main__") or fn.__module__.startswith("__"):
        raise ValueError(f"{fn.__qualname__} is defined in a notebook or script (module {fn.__module__!r}); ranks "
                         "import their function by name: put it in a .py module (e.g. lessons/ranks/)")
    target = f"{fn.__module__}:{fn.__qualname__}"
    found, _ = _resolve_name(target, allow)
    return found


def _resolve_name(target: str, allow: tuple[str, ...] = ()):
    module, sep, qualname = target.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"target must be 'package.module:function', got {target!r}")
    if module == "__main__":
        raise ValueError("a target in __main__ cannot be imported by the ranks: put the function in a module")
    if not _allowed(module, allowed_prefixes(allow)):
        raise ValueError(f"target module {module!r} is outside the lab's packages {TRUSTED_PACKAGES}: a job runs code, "
                         f"so other modules must be allowed explicitly (launch(..., allow=({module!r},)) or "
                         f"{ALLOW_ENV}={module})")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"target module {module!r} cannot be imported: {e}") from e
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not inspect.isfunction(obj):
        raise ValueError(f"target {target!r}: module {module!r} has no function {qualname!r}")
    return target, obj


def _root_of(module: str) -> str:
    """The sys.path entry that provides an imported module (a.b.c in ROOT/a/b/c.py -> ROOT)."""
    file = Path(sys.modules[module].__file__).resolve()
    depth = module.count(".") + (1 if file.name == "__init__.py" else 0)
    return str(file.parents[depth])


def encode_config(fn, config) -> dict | None:
    """The config as JSON-ready data, after checking it is an instance of the function's config dataclass."""
    cls = config_type(fn)
    if cls is None:
        if config is not None:
            raise ValueError(f"{fn.__qualname__} takes no config, got {config!r}")
        return None
    if config is None:
        config = cls()  # the dataclass's defaults (raises TypeError if a field has none)
    if not isinstance(config, cls):
        raise ValueError(f"config must be a {cls.__qualname__} (the type {fn.__qualname__} is annotated with), "
                         f"got {type(config).__name__}")
    try:
        return json.loads(json.dumps(dataclasses.asdict(config)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config fields must be JSON-serialisable (numbers, strings, tuples): {e}") from e


def decode_config(cls: type, data: dict):
    """Rebuild a config dataclass from JSON data: lists become tuples where the field is a tuple, nested
    dataclasses are rebuilt, and __post_init__ validates it again."""
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for {cls.__qualname__}; its fields: "
                         f"{[f.name for f in dataclasses.fields(cls)]}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints.get(f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = decode_config(hint, value)
        elif typing.get_origin(hint) is tuple or hint is tuple:
            value = _tuples(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


# --- the launcher ---------------------------------------------------------------------------------------------

def choose_backend(backend: str, nprocs: int) -> str:
    """'auto': NCCL if there is a GPU for every rank, else gloo on the CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < nprocs:
        raise ValueError(f"backend 'nccl' needs a GPU per rank: {nprocs} ranks, {torch.cuda.device_count()} GPUs")
    return backend


def run_root() -> Path:
    return Path(os.environ.get(RUN_ROOT_ENV) or tempfile.gettempdir())


def write_job(run_dir: Path, target: str, config: dict | None, backend: str, collective_timeout_s: float) -> Path:
    """job.json for labtools.dist.worker; each run gets an id that its ranks write into their results."""
    job = run_dir / "job.json"
    job.write_text(json.dumps({"run_id": uuid.uuid4().hex, "target": target, "config": config, "backend": backend,
                               "collective_timeout_s": collective_timeout_s, "run_dir": str(run_dir.resolve())}))
    return job


def launch(fn, nprocs: int, config=None, *, backend: str = "auto", timeout_s: float | None = 300,
           collective_timeout_s: float = 60, desc: str | None = None, show_progress: bool = True,
           keep_dir: bool = False, allow: tuple[str, ...] = (), max_restarts: int = 0) -> list[dict]:
    """Run fn(config) on nprocs ranks via torchrun and return each rank's dict, in rank order.

    timeout_s bounds the whole run (None: no bound — a run that shows progress may take as long as it needs,
    and a hang still ends at the collective timeout); collective_timeout_s is the process-group timeout (a collective that
    not every rank reaches fails after it). allow names extra module prefixes a target may come from.
    max_restarts: when a rank fails, torchrun stops the group and starts it again, up to this many times (an
    elastic run: the rank function resumes from its own checkpoint; toolkit.restart_count() says which attempt
    runs); the results are the last attempt's, and failures of earlier attempts are not the run's failure.
    Bad input raises ValueError before any process starts.
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    if (timeout_s is not None and not timeout_s > 0) or not collective_timeout_s > 0:
        raise ValueError(f"timeout_s (or None) and collective_timeout_s must be > 0, got {timeout_s}, "
                         f"{collective_timeout_s}")
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or not 0 <= max_restarts <= 100:
        raise ValueError(f"max_restarts must be an int in [0, 100], got {max_restarts!r}")
    target = target_of(fn, allow)
    _, fn = _resolve_name(target, allow)
    data = encode_config(fn, config)
    backend = choose_backend(backend, nprocs)
    if backend == "gloo" and nprocs > MAX_GLOO_RANKS:
        raise ValueError(f"nprocs must be at most {MAX_GLOO_RANKS} for CPU (gloo) ranks on one machine, got {nprocs}")

    run_dir = Path(tempfile.mkdtemp(prefix="labtools-dist-", dir=run_root()))
    (run_dir / "pids").mkdir()
    (run_dir / "tmp").mkdir()
    job = write_job(run_dir, target, data, backend, collective_timeout_s)
    env = dict(os.environ)
    env[RUN_DIR_ENV] = str(run_dir)
    env["TMPDIR"] = str(run_dir / "tmp")  # torchrun's torchelastic_* directories and the ranks' temp files
    env[ALLOW_ENV] = ",".join(allowed_prefixes(allow)[len(TRUSTED_PACKAGES):])
    roots = {_root_of(target.split(":")[0]), str(Path(__file__).resolve().parents[2])}
    env["PYTHONPATH"] = os.pathsep.join(sorted(roots) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if backend == "gloo":
        env["OMP_NUM_THREADS"] = "1"  # one thread per rank: ranks share this machine's cores
    if max_restarts:
        # torchrun shares one TCP store across restarts, and the process group's keys carry no attempt number:
        # a restarted rank could read a dead peer's address from the failed attempt (gloo: "connectFullMesh
        # failed ... Connect timeout", 1 run in ~4 here). A store per attempt (rank 0 hosts it) has no stale keys.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [sys.executable, "-m", "labtools.dist.supervise", str(os.getpid()), str(run_dir), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.2", "-m", "labtools.dist.worker", str(job)]
    log = open(run_dir / "torchrun.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bar = progress(total=None, desc=desc or f"{target} × {nprocs} ({backend})", disable=not show_progress)
    ok = False
    try:
        start = time.monotonic()
        while proc.poll() is None and not _all_results(run_dir, nprocs):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                _terminate(proc, run_dir)
                raise TimeoutError(f"launch of {target} on {nprocs} ranks exceeded timeout_s={timeout_s}; every "
                                   "process of the run was stopped.\n" + _log_tails(run_dir, nprocs))
            _update_bar(bar, run_dir)
            time.sleep(0.05)
        _update_bar(bar, run_dir)
        log.flush()
        failure = diagnose(run_dir, nprocs, 0 if proc.returncode is None else proc.returncode)
        if failure is not None:
            raise failure
        results = read_results(run_dir, nprocs)
        ok = True
        return results
    except KeyboardInterrupt:
        _terminate(proc, run_dir)
        raise
    finally:
        bar.close()
        if ok and proc.poll() is None:  # every result is in: let the ranks and torchrun exit in the background
            _start_reaping(proc, run_dir, log, keep_dir)
        else:
            if proc.poll() is None or run_pids(run_dir):
                _terminate(proc, run_dir)
            log.close()
            if not keep_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            elif not ok:
                print(f"run directory kept: {run_dir}", file=sys.stderr)


def _all_results(run_dir: Path, nprocs: int) -> bool:
    return all((run_dir / f"rank{r}.json").exists() for r in range(nprocs))


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
        if proc.poll() is None or run_pids(run_dir):
            _terminate(proc, run_dir)
        log.close()
        if not keep_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        _REAPERS.discard(threading.current_thread())


def _start_reaping(*args) -> None:
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


# --- processes ------------------------------------------------------------------------------------------------

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


def _terminate(proc: subprocess.Popen, run_dir: Path, grace_s: float = 5.0) -> None:
    """Stop the supervisor (it stops torchrun, which stops its ranks), then SIGKILL what of this run is left."""
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
    for pid in run_pids(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- results and failures -------------------------------------------------------------------------------------

_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(log: str) -> dict[int, int]:
    """{rank: exit code} of the failures torchrun reported (a negative code is the signal that killed it)."""
    return {int(r): int(code) for r, code in _FAILURE.findall(log)}


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

    A rank killed by a signal other than torchrun's own SIGTERM, without an error of its own, is the cause
    (its peers then fail with "connection closed"); else the first Python error any rank recorded (later ones
    are consequences); else what torchrun reported.
    """
    errors = _read_errors(run_dir)
    if returncode == 0 and _all_results(run_dir, nprocs):
        return None  # errors of earlier attempts (an elastic run that restarted) are not this run's failure
    last = max([e.get("attempt", 0) for e in errors], default=0)
    errors = [e for e in errors if e.get("attempt", 0) == last]  # the attempt that ended the run
    log = (run_dir / "torchrun.log").read_text(errors="replace") if (run_dir / "torchrun.log").exists() else ""
    failures = torchrun_failures(log)
    with_error = {e["rank"] for e in errors}
    signalled = sorted(r for r, code in failures.items() if code < 0 and r not in with_error
                       and -code != signal.SIGTERM and not (run_dir / f"rank{r}.json").exists())
    if signalled:
        r = signalled[0]
        name = _signal_name(failures[r])
        return RankFailed(r, f"killed by {name} (no Python error: the process was killed from outside, e.g. by the "
                             "OOM killer or a kill command)", logs=_rank_log(run_dir, r), signal_name=name)
    if errors:
        first = min(errors, key=lambda e: e["time"])
        return RankFailed(first["rank"], first["error"], first["traceback"], _rank_log(run_dir, first["rank"]))
    if failures:
        r = min(failures)
        code = failures[r]
        what = f"killed by {_signal_name(code)}" if code < 0 else f"exited with code {code} without a Python error"
        return RankFailed(r, what, logs=_rank_log(run_dir, r), signal_name=_signal_name(code) if code < 0 else None)
    return RuntimeError(f"torchrun exited with code {returncode} and no rank reported a failure.\n"
                        + _log_tails(run_dir, nprocs))


def _log_tails(run_dir: Path, nprocs: int) -> str:
    tails = [f"--- rank {r} ---\n" + "\n".join(_rank_log(run_dir, r).splitlines()[-5:]) for r in range(nprocs)
             if (run_dir / f"rank{r}.log").exists()]
    torchrun = (run_dir / "torchrun.log").read_text(errors="replace") if (run_dir / "torchrun.log").exists() else ""
    return "\n".join(tails + ["--- torchrun ---", *torchrun.splitlines()[-12:]])


def read_results(run_dir: Path, nprocs: int | None = None) -> list[dict]:
    """Each rank's result of the run whose job.json is in run_dir, in rank order — all from that one run.

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


def _update_bar(bar, run_dir: Path) -> None:
    try:
        p = json.loads((run_dir / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    if bar.total != p["total"]:
        bar.total = p["total"]
    if p.get("desc"):
        bar.set_postfix_str(p["desc"], refresh=False)
    if p["done"] > bar.n:
        bar.update(p["done"] - bar.n)  # update() redraws at tqdm's own pace (rarely when there is no frontend)
