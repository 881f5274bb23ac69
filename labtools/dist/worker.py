"""One rank of a labtools.dist.launch run. torchrun starts it; it is not meant to be run by hand:

    $ python -m torch.distributed.run --standalone --nproc-per-node=2 -m labtools.dist.worker JOB.json

JOB.json: {"target": "package.module:function", "config": {...}, "backend": "gloo" | "nccl",
"collective_timeout_s": 60, "run_dir": "..."}. The rank writes run_dir/rank{r}.json (the function's dict
plus a "dist" entry), or run_dir/rank{r}.error.json with its traceback, and its output to rank{r}.log.

Teardown order (torch 2.13 + gloo could abort at exit with "terminate called without an active
exception"): the function's objects are released when it returns, then gc.collect(), a barrier so no
rank tears down while a peer still talks to it, then destroy_process_group(). A real failure skips the
barrier and exits non-zero, so torchrun stops the other ranks.
"""

import ctypes
import gc
import importlib
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


def _die_with_parent() -> None:
    """Linux: get SIGKILL if torchrun (our parent) dies, so a killed launch cannot leave this rank behind."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C++ messages too) to a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(job_path: str) -> int:
    _die_with_parent()
    job = json.loads(Path(job_path).read_text())
    run_dir = Path(job["run_dir"])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    (run_dir / "pids" / f"rank{rank}.pid").write_text(str(os.getpid()))
    _redirect_output(run_dir / f"rank{rank}.log")
    try:
        backend = job["backend"]
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
            device = torch.device("cpu")
        dist.init_process_group(backend, timeout=timedelta(seconds=job["collective_timeout_s"]))
        module, function = job["target"].split(":")
        fn = getattr(importlib.import_module(module), function)
        t0 = time.perf_counter()
        result = fn(job["config"])
        seconds = time.perf_counter() - t0
        if not isinstance(result, dict):
            raise TypeError(f"{job['target']} must return a dict, returned {type(result).__name__}")
        result = dict(result, dist={"rank": rank, "world_size": dist.get_world_size(), "backend": backend,
                                    "device": str(device), "seconds": seconds})
        payload = json.dumps(result)
    except BaseException as e:  # noqa: BLE001 - recorded for the launcher, then the rank exits non-zero
        error = {"rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()}
        (run_dir / f"rank{rank}.error.json").write_text(json.dumps(error))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # no teardown: a peer may be stuck in a collective; torchrun stops the rest
    del fn
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    (run_dir / f"rank{rank}.json").write_text(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
