"""Lesson 16's rank function: this machine measured for the planner, and the run it predicts.

Launched from notebooks/16_plan_a_run.ipynb through lessons/plan_a_run/calibration.py, or by hand:

    $ python -m labtools.parallel make-job lessons.plan_a_run.ranks:calibrate '{}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker RUN/job.json
"""

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools import profiling
from labtools.config import LabConfig
from labtools.optim import param_groups
from labtools.parallel.toolkit import (build_gpt, device, global_batch, rank, rank_rows, report_progress, timed_steps,
                                       world_size)


# One bucket for all the gradients: DDP all-reduces them once backward is done, so the all-reduce cannot hide
# behind backward and the planner's dp_overlap = 0 describes what runs. (With DDP's default buckets, the all-reduces
# that do overlap backward compete with it for this machine's two cores, and a rank that must answer a ring step
# waits for the scheduler: they cost more than the same bytes sent alone.)
BUCKET_MB = 1024


@dataclass(frozen=True, kw_only=True)
class CalibrationJob(LabConfig):
    rounds: int = 5
    matmul_sizes: tuple = (128, 256)
    repeats: int = 10      # all-reduces timed per round


def _all_reduce_s(t: torch.Tensor, repeats: int) -> float:
    """Seconds per all-reduce of t, every rank together."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    if t.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def calibrate(job: CalibrationJob) -> dict:
    """What the planner needs from this machine, and the run it predicts, in alternating rounds:
    - the matmul peak (rank 0 alone, the other ranks waiting);
    - a training step of rank 0 alone with job.batch_size rows (the others waiting): the compute term;
    - all-reduces of the gradients' size and of one number: the bandwidth β and the latency α;
    - the same step on every rank under DDP, job.batch_size rows each: the run the planner predicts.
    One thread per rank (torchrun's OMP_NUM_THREADS=1)."""
    dev = device()
    peak = None
    if rank() == 0:
        peak = profiling.matmul_peak(job.matmul_sizes, dev)["fp32"]["peak"]
    dist.barrier()
    g = torch.Generator().manual_seed(job.seed)
    solo = build_gpt(job)
    solo_opt = torch.optim.AdamW(param_groups(solo, 0.1), lr=job.lr)
    ddp = DDP(build_gpt(job), bucket_cap_mb=BUCKET_MB)
    ddp_opt = torch.optim.AdamW(param_groups(ddp.module, 0.1), lr=job.lr)
    N = world_size()
    rows = [global_batch(job, g, N * job.batch_size) for _ in range(job.steps + 1)]
    mine = [(rank_rows(X), rank_rows(Y)) for X, Y in rows]
    n_params = sum(p.numel() for p in ddp.module.parameters())
    grads, one = torch.zeros(n_params, device=dev), torch.zeros(1, device=dev)
    timed_steps(ddp, ddp_opt, mine[:1])  # warm-up: DDP's first step builds its buckets
    if rank() == 0:
        timed_steps(solo, solo_opt, mine[:1])
    _all_reduce_s(grads, 1)
    out = {"solo_s": [], "together_s": [], "ddp_s": [], "all_reduce_s": [], "latency_s": []}
    for r in range(job.rounds):
        dist.barrier()
        if rank() == 0:
            out["solo_s"].append(timed_steps(solo, solo_opt, mine[1:]))
        dist.barrier()
        with ddp.no_sync():  # every rank computes at once, each step waits for the slowest, no gradients sent
            out["together_s"].append(timed_steps(ddp, ddp_opt, mine[1:], wait=True))
        dist.barrier()
        out["ddp_s"].append(timed_steps(ddp, ddp_opt, mine[1:]))
        out["all_reduce_s"].append(_all_reduce_s(grads, job.repeats))
        out["latency_s"].append(_all_reduce_s(one, job.repeats))
        report_progress(r + 1, job.rounds, "calibration rounds")
    medians = {k: statistics.median(v) for k, v in out.items() if v}
    return {"rounds": out, "median": medians, "peak": peak, "n_params": n_params, "world": N,
            "vocab": ddp.module.config.vocab_size, "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20}
