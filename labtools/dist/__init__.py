"""Launch real multi-process runs from Python or a notebook cell, through torchrun.

    results = launch("lessons.data_parallel:ddp_step", nprocs=2, config={"steps": 10})

`launch` runs `python -m torch.distributed.run --standalone --nproc-per-node N -m labtools.dist.worker JOB`
as a subprocess. Each rank (labtools/dist/worker.py) initialises the process group (NCCL with one GPU
per rank when there are enough GPUs, else gloo on the CPU with one thread per rank), calls
`function(config) -> dict`, and writes the dict; `launch` returns them in rank order, each with a
"dist" entry saying rank, world size, backend and device.

Failure handling: a rank that raises -> RankFailed naming the rank with its traceback, within seconds
(torchrun stops the other ranks); a collective that not every rank reaches -> the process-group timeout
(collective_timeout_s) raises in the ranks; an overall timeout or a KeyboardInterrupt -> every process
of the run is terminated. Ranks die with torchrun (PR_SET_PDEATHSIG) and are killed by PID if still
alive, so no run leaves a process behind.

Inside a rank: rank(), world_size(), device(), report_progress().
The same worker runs on many nodes; see the README ("Many GPUs, many nodes").
Introduced in notebooks/07_data_parallel.ipynb.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from labtools.progress import progress

BACKENDS = ("auto", "gloo", "nccl")
RUN_DIR_ENV = "LABTOOLS_DIST_RUN_DIR"


class RankFailed(RuntimeError):
    """A rank raised; .rank, .traceback and .logs (the rank's captured output) say where and why."""

    def __init__(self, rank: int, error: str, traceback: str, logs: str):
        super().__init__(f"rank {rank} failed: {error}\n\n--- traceback of rank {rank} ---\n{traceback}")
        self.rank, self.error, self.traceback, self.logs = rank, error, traceback, logs


# --- inside a rank ----------------------------------------------------------------------------------------

def rank() -> int:
    return torch.distributed.get_rank()


def world_size() -> int:
    return torch.distributed.get_world_size()


def device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def report_progress(done: int, total: int, desc: str = "") -> None:
    """From rank 0: tell the launcher's progress bar how far the run is (cheap; call once per step)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or rank() != 0:
        return
    tmp = Path(run_dir) / "progress.json.tmp"
    tmp.write_text(json.dumps({"done": done, "total": total, "desc": desc}))
    tmp.replace(Path(run_dir) / "progress.json")


# --- the launcher -------------------------------------------------------------------------------------------

def choose_backend(backend: str, nprocs: int) -> str:
    """'auto': NCCL if there is a GPU for every rank, else gloo on the CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < nprocs:
        raise ValueError(f"backend 'nccl' needs a GPU per rank: {nprocs} ranks, {torch.cuda.device_count()} GPUs")
    return backend


def _check_target(target: str) -> Path:
    """Import the target's module here, before any process starts; return the sys.path root that provides it."""
    module, sep, function = target.partition(":")
    if not sep or not module or not function:
        raise ValueError(f"target must be 'package.module:function', got {target!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"target module {module!r} cannot be imported: {e}") from e
    if not callable(getattr(mod, function, None)):
        raise ValueError(f"target {target!r}: module {module!r} has no function {function!r}")
    file = Path(mod.__file__).resolve()
    depth = module.count(".") + (1 if file.name == "__init__.py" else 0)  # a.b.c in root/a/b/c.py: parents[2]
    return file.parents[depth]


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
    """Stop torchrun (it stops its ranks), then SIGKILL whatever of this run is still alive, by PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
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


def _read_failure(run_dir: Path) -> RankFailed | None:
    """The first error any rank recorded (later ones are usually consequences: a peer hung up)."""
    errors = []
    for f in run_dir.glob("rank*.error.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not errors:
        return None
    first = min(errors, key=lambda e: e["time"])
    log = run_dir / f"rank{first['rank']}.log"
    return RankFailed(first["rank"], first["error"], first["traceback"], log.read_text() if log.exists() else "")


def launch(target: str, nprocs: int, config: dict | None = None, *, backend: str = "auto", timeout_s: float = 300,
           collective_timeout_s: float = 60, desc: str | None = None, show_progress: bool = True,
           keep_dir: bool = False) -> list[dict]:
    """Run target ("package.module:function") on nprocs ranks via torchrun and return each rank's dict.

    timeout_s bounds the whole run; collective_timeout_s is the process-group timeout (a collective that
    not every rank reaches fails after it). Bad input raises ValueError before any process starts.
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    if not timeout_s > 0 or not collective_timeout_s > 0:
        raise ValueError(f"timeout_s and collective_timeout_s must be > 0, got {timeout_s}, {collective_timeout_s}")
    root = _check_target(target)
    try:
        config_json = json.dumps(config or {})
    except (TypeError, ValueError) as e:
        raise ValueError(f"config must be JSON-serialisable (numbers, strings, lists, dicts): {e}") from e
    backend = choose_backend(backend, nprocs)

    run_dir = Path(tempfile.mkdtemp(prefix="labtools-dist-"))
    (run_dir / "pids").mkdir()
    job = run_dir / "job.json"
    job.write_text(json.dumps({"target": target, "config": json.loads(config_json), "backend": backend,
                               "collective_timeout_s": collective_timeout_s, "run_dir": str(run_dir)}))
    env = dict(os.environ)
    env[RUN_DIR_ENV] = str(run_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(Path(__file__).resolve().parents[2])] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if backend == "gloo":
        env["OMP_NUM_THREADS"] = "1"  # one thread per rank: ranks share this machine's cores
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
           "--max-restarts=0", "--monitor-interval=0.2", "-m", "labtools.dist.worker", str(job)]
    log = open(run_dir / "torchrun.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bar = progress(total=None, desc=desc or f"{target} × {nprocs} ({backend})", disable=not show_progress)
    ok = False
    try:
        start = time.monotonic()
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                _terminate(proc, run_dir)
                raise TimeoutError(f"launch of {target} on {nprocs} ranks exceeded timeout_s={timeout_s}; every "
                                   f"process of the run was stopped. Rank logs: {run_dir}")
            _update_bar(bar, run_dir)
            time.sleep(0.1)
        _update_bar(bar, run_dir)
        failure = _read_failure(run_dir)
        if failure is not None:
            failure.add_note(f"rank logs: {run_dir}")
            raise failure
        if proc.returncode != 0:  # a rank died outside Python (a signal, an abort at exit): show what it said
            tails = "\n".join(f"--- rank {r} ---\n" + "\n".join(
                (run_dir / f"rank{r}.log").read_text(errors="replace").splitlines()[-5:])
                for r in range(nprocs) if (run_dir / f"rank{r}.log").exists())
            torchrun = "\n".join((run_dir / "torchrun.log").read_text(errors="replace").splitlines()[-12:])
            raise RuntimeError(f"torchrun exited with code {proc.returncode} and no rank raised a Python error. "
                               f"Logs: {run_dir}\n{tails}\n--- torchrun ---\n{torchrun}")
        results = []
        for r in range(nprocs):
            f = run_dir / f"rank{r}.json"
            if not f.exists():
                raise RuntimeError(f"rank {r} finished without writing its result. Logs: {run_dir}")
            results.append(json.loads(f.read_text()))
        ok = True
        return results
    except KeyboardInterrupt:
        _terminate(proc, run_dir)
        raise
    finally:
        if proc.poll() is None or run_pids(run_dir):
            _terminate(proc, run_dir)
        log.close()
        bar.close()
        if ok and not keep_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


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
