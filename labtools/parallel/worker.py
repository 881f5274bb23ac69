"""One rank of a labtools.parallel run. labtools.parallel.local or torchrun starts it, not you:

    $ python -m torch.distributed.run --standalone --nproc-per-node=2 -m labtools.parallel.worker JOB.json

JOB.json: {"run_id": "...", "target": "package.module:function", "config": {...} | null, "backend": "gloo" |
"nccl", "collective_timeout_s": 60, "run_dir": "..."}. The config is rebuilt into the dataclass the function is
annotated with. The rank writes run_dir/rank{r}.json ({"result": the function's result dataclass as JSON, "dist":
where and how it ran}), or
run_dir/rank{r}.attempt{a}.error.json with its traceback (a = torchrun's restart count), and its output to
rank{r}.log.

A job file is code: the target must come from the lab's packages or a prefix listed in LABTOOLS_ALLOW_TARGETS
in this process's environment (not in the job file).

Teardown (torch 2.13 + gloo could abort at exit with "terminate called without an active exception"): the
result is written first, then the function's objects are released, gc.collect(), a barrier so no rank tears
down while a peer still talks to it, then destroy_process_group(). A failed teardown (a peer that finished
more than the collective timeout later) is logged, never fatal: the result is already safe. A real failure
skips the teardown and exits non-zero, so the agent stops the other ranks.
"""

import faulthandler
import gc
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from labtools.parallel.codec import config_type, decode_config, encode_result
from labtools.parallel.supervise import tie_to_parent
from labtools.parallel.targets import resolve_target


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C++ messages too) to a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _write(path: Path, payload: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(payload)
    tmp.replace(path)  # readers never see half a file


def main(job_path: str) -> int:
    tie_to_parent(signal.SIGKILL, os.getppid())  # the agent (local.py or torchrun) dies -> this rank dies
    job = json.loads(Path(job_path).read_text())
    run_dir = Path(job["run_dir"])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # > 0: torchrun restarted the group
    if attempt:
        (run_dir / f"rank{rank}.json").unlink(missing_ok=True)  # a result of a failed attempt is not this run's
    (run_dir / "pids").mkdir(exist_ok=True)
    (run_dir / "pids" / f"rank{rank}.pid").write_text(str(os.getpid()))
    _redirect_output(run_dir / f"rank{rank}.log")
    # on SIGUSR1 every thread's stack goes to the rank's log: a launch that runs out of time asks for it, to say
    # which line each rank was on (a learner's loop that never ends, say)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        _, fn = resolve_target(job["target"])
        cls = config_type(fn)
        args = () if cls is None else (decode_config(cls, job["config"] or {}),)
        backend = job["backend"]
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
            device = torch.device("cpu")
        dist.init_process_group(backend, timeout=timedelta(seconds=job["collective_timeout_s"]))
        t0 = time.perf_counter()
        result = fn(*args)
        seconds = time.perf_counter() - t0
        result = encode_result(fn, result)
        payload = json.dumps({"result": result, "dist": {
            "rank": rank, "world_size": dist.get_world_size(), "backend": backend, "device": str(device),
            "seconds": seconds, "run_id": job.get("run_id"), "restarts": attempt}})
    except BaseException as e:  # noqa: BLE001 - recorded for the launcher, then the rank exits non-zero
        error = {"rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc(), "run_id": job.get("run_id"), "attempt": attempt}
        _write(run_dir / f"rank{rank}.attempt{attempt}.error.json", json.dumps(error))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # no teardown: a peer may be stuck in a collective; torchrun stops the rest
    _write(run_dir / f"rank{rank}.json", payload)
    del fn, result
    gc.collect()
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the result is written; a slow peer's teardown must not lose it
        print(f"teardown failed after the result was written (not fatal): {type(e).__name__}: {e}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter finalisation (a second or so of torch teardown): everything is written


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
