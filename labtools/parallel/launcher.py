"""Launch real multi-process runs from Python or a notebook cell, as torchrun does.

    from lessons.data_parallel import settings
    from lessons.data_parallel.ranks import equivalence
    results = launch(equivalence, nprocs=2, config=settings("smoke"))

`launch` takes the rank function itself (a module-level function of the lab's packages; it derives
"module:qualname" and refuses lambdas, closures and functions defined in a notebook) and a config
dataclass, which is sent as JSON and rebuilt, typed and validated, inside each rank from the function's
annotation. It runs

    python -m labtools.parallel.supervise PARENT RUN_DIR -- python -m labtools.parallel.local N -- \
        python -m labtools.parallel.worker RUN_DIR/job.json

labtools/parallel/local.py starts the N ranks with the environment torchrun would give them, without its elastic
agent (2.5 s of a 5 s launch here); a run that may restart (max_restarts > 0) runs under torchrun itself:

    python -m labtools.parallel.supervise PARENT RUN_DIR -- python -m torch.distributed.run --standalone \
        --nproc-per-node N --max-restarts R -m labtools.parallel.worker RUN_DIR/job.json

Each rank (labtools/parallel/worker.py) initialises the process group (NCCL with one GPU per rank when there
are enough GPUs, else gloo on the CPU with one thread per rank), calls `function(config) -> Result` (a
dataclass, its return annotation) and writes it as JSON; `launch` rebuilds each rank's Result, checked field by
field like the config, and returns them in rank order as a `Ranks` list whose `.dist[r]` says rank r's world
size, backend and device.

Failure handling (diagnose.py and processes.py; tests/test_dist.py):
- a rank that raises -> RankFailed naming the rank, with its traceback, within seconds;
- a rank killed by a signal (no result, no error of its own) -> RankFailed naming that rank and signal,
  even when its peers then fail with "connection closed";
- a collective that not every rank reaches -> the process-group timeout (collective_timeout_s);
- an overall timeout -> RunTimedOut, with the line of a learner's function each rank was on (their stacks);
- an overall timeout, a KeyboardInterrupt or a panel's Cancel -> every process of the run is stopped, and any
  process a rank started (it inherits the run directory in its environment);
- the caller itself dies (SIGTERM, SIGHUP, SIGKILL: a closed terminal, a CI timeout, the OOM killer) ->
  the supervisor gets a parent-death signal and stops torchrun; ranks die with torchrun.
torchrun's own files go under the run directory, which is removed afterwards (keep_dir=True keeps it).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from labtools.parallel.codec import decode_result, encode_config, result_type
from labtools.parallel.diagnose import (DistInfo, Ranks, RunTimedOut, all_results, diagnose, learner_lines, log_tails,
                                        read_results)
from labtools.parallel.processes import RUN_DIR_ENV, run_pids, run_processes, start_reaping, terminate
from labtools.parallel.targets import ALLOW_ENV, TRUSTED_PACKAGES, allowed_prefixes, resolve_target, root_of, target_of
from labtools.progress import Cancelled, check_cancelled, progress

BACKENDS = ("auto", "gloo", "nccl")
RUN_ROOT_ENV = "LABTOOLS_RUN_ROOT"          # where run directories are made (default: the temp directory)
MAX_GLOO_RANKS = 64                         # CPU ranks on one machine; beyond this a launch is a mistake


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
    """job.json for labtools.parallel.worker; each run gets an id that its ranks write into their results."""
    job = run_dir / "job.json"
    job.write_text(json.dumps({"run_id": uuid.uuid4().hex, "target": target, "config": config, "backend": backend,
                               "collective_timeout_s": collective_timeout_s, "run_dir": str(run_dir.resolve())}))
    return job


def launch(fn, nprocs: int, config=None, *, backend: str = "auto", timeout_s: float | None = 300,
           collective_timeout_s: float = 60, desc: str | None = None, show_progress: bool = True,
           keep_dir: bool = False, allow: tuple[str, ...] = (), max_restarts: int = 0) -> Ranks:
    """Run fn(config) on nprocs ranks and return each rank's result, in rank order, typed as fn's
    return annotation (a dataclass; `.dist[r]` says where rank r ran).

    timeout_s bounds the whole run (None: no bound — a run that shows progress may take as long as it needs,
    and a hang still ends at the collective timeout); collective_timeout_s is the process-group timeout (a
    collective that not every rank reaches fails after it). allow names extra module prefixes a target may come from.
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
    _, fn = resolve_target(target, allow)
    data = encode_config(fn, config)
    backend = choose_backend(backend, nprocs)
    if backend == "gloo" and nprocs > MAX_GLOO_RANKS:
        raise ValueError(f"nprocs must be at most {MAX_GLOO_RANKS} for CPU (gloo) ranks on one machine, got {nprocs}")

    run_dir = Path(tempfile.mkdtemp(prefix="labtools-run-", dir=run_root()))
    (run_dir / "pids").mkdir()
    (run_dir / "tmp").mkdir()
    job = write_job(run_dir, target, data, backend, collective_timeout_s)
    env = dict(os.environ)
    env[RUN_DIR_ENV] = str(run_dir)
    env["TMPDIR"] = str(run_dir / "tmp")  # torchrun's torchelastic_* directories and the ranks' temp files
    env[ALLOW_ENV] = ",".join(allowed_prefixes(allow)[len(TRUSTED_PACKAGES):])
    roots = {root_of(target.split(":")[0]), str(Path(__file__).resolve().parents[2])}
    env["PYTHONPATH"] = os.pathsep.join(sorted(roots) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if backend == "gloo":
        env["OMP_NUM_THREADS"] = "1"  # one thread per rank: ranks share this machine's cores
    if max_restarts:
        # torchrun shares one TCP store across restarts, and the process group's keys carry no attempt number:
        # a restarted rank could read a dead peer's address from the failed attempt (gloo: "connectFullMesh
        # failed ... Connect timeout", 1 run in ~4 here). A store per attempt (rank 0 hosts it) has no stale keys.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if max_restarts:  # torchrun's elastic agent restarts the group
        agent = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
                 f"--max-restarts={max_restarts}", "--monitor-interval=0.2"]
    else:  # the same ranks, the same environment, without the agent's 2.5 s start (labtools/parallel/local.py)
        agent = [sys.executable, "-m", "labtools.parallel.local", str(nprocs), "--", sys.executable]
    cmd = [sys.executable, "-m", "labtools.parallel.supervise", str(os.getpid()), str(run_dir), "--", *agent,
           "-m", "labtools.parallel.worker", str(job)]
    log = open(run_dir / "torchrun.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bar = progress(total=None, desc=desc or f"{target} × {nprocs} ({backend})", disable=not show_progress)
    ok = False
    try:
        start = time.monotonic()
        while proc.poll() is None and not all_results(run_dir, nprocs):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                where = _where_now(run_dir, nprocs)
                terminate(proc, run_dir)
                raise RunTimedOut(f"launch of {target} on {nprocs} ranks exceeded timeout_s={timeout_s}; every "
                                  "process of the run was stopped.\n" + log_tails(run_dir, nprocs), where, timeout_s)
            _update_bar(bar, run_dir)
            check_cancelled()  # a panel's Cancel: stopped below like an Interrupt
            time.sleep(0.05)
        _update_bar(bar, run_dir)
        log.flush()
        failure = diagnose(run_dir, nprocs, 0 if proc.returncode is None else proc.returncode)
        if failure is not None:
            raise failure
        results = typed(fn, read_results(run_dir, nprocs))
        ok = True
        return results
    except (KeyboardInterrupt, Cancelled):
        terminate(proc, run_dir)
        raise
    finally:
        bar.close()
        if ok and proc.poll() is None:  # every result is in: let the ranks and torchrun exit in the background
            start_reaping(proc, run_dir, log, keep_dir)
        else:
            if proc.poll() is None or run_processes(run_dir):
                terminate(proc, run_dir)
            log.close()
            if not keep_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            elif not ok:
                print(f"run directory kept: {run_dir}", file=sys.stderr)



def _where_now(run_dir: Path, nprocs: int) -> dict[int, tuple[str, int]]:
    """Ask every rank for its stack (SIGUSR1: the worker's faulthandler writes it to the rank's log) and read the
    line of a learner's function each was on."""
    for pid in run_pids(run_dir):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    return learner_lines(run_dir, nprocs)


def typed(fn, raw: list[dict]) -> Ranks:
    """The ranks' results rebuilt as fn's return dataclass (validated like the config), with where each ran."""
    dist = [DistInfo(**r["dist"]) for r in raw]
    cls = result_type(fn)
    return Ranks([decode_result(cls, r["result"]) for r in raw], dist)


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
