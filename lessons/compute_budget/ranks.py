"""Lesson 12's rank function: weak scaling of DDP on this machine (each rank keeps its own batch size).

Launched from notebooks/12_compute_budget.ipynb through lessons/compute_budget/, or by hand:

    $ python -m labtools.parallel make-job lessons.compute_budget.ranks:weak_scaling '{"steps": 10}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker RUN/job.json
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.config import LabConfig
from labtools.optim import param_groups
from labtools.parallel.toolkit import (build_gpt, global_batch, rank, rank_rows, report_progress, timed_steps,
                                       world_size)


@dataclass(frozen=True, kw_only=True)
class ScalingJob(LabConfig):
    rounds: int = 3        # alternating rounds of (rank 0 alone, every rank with DDP)


@dataclass(frozen=True)
class WeakScaling:
    """One rank's tokens per second, round by round."""
    solo_tokens_per_s: list[float]  # rank 0 training alone, the others waiting (empty on the other ranks)
    ddp_tokens_per_s: list[float]   # the whole group's tokens under DDP, timed on this rank


def weak_scaling(job: ScalingJob) -> WeakScaling:
    """Tokens per second of rank 0 training alone (the other ranks wait at a barrier, their cores idle) and of
    every rank training together under DDP, each rank with the same job.batch_size rows: alternating rounds, so
    that drift on a shared machine hits both alike. One thread per rank (OMP_NUM_THREADS=1, as torchrun sets)."""
    g = torch.Generator().manual_seed(job.seed)
    solo = build_gpt(job)
    solo_opt = torch.optim.AdamW(param_groups(solo, 0.1), lr=job.lr)
    ddp = DDP(build_gpt(job))
    ddp_opt = torch.optim.AdamW(param_groups(ddp.module, 0.1), lr=job.lr)
    N, tokens = world_size(), job.batch_size * job.block_size
    rows = [global_batch(job, g, N * job.batch_size) for _ in range(job.steps + 1)]
    mine = [(rank_rows(X), rank_rows(Y)) for X, Y in rows]
    timed_steps(ddp, ddp_opt, mine[:1])  # warm-up: DDP's first step builds its buckets
    if rank() == 0:
        timed_steps(solo, solo_opt, mine[:1])
    out = WeakScaling(solo_tokens_per_s=[], ddp_tokens_per_s=[])
    for r in range(job.rounds):
        dist.barrier()
        if rank() == 0:
            out.solo_tokens_per_s.append(tokens / timed_steps(solo, solo_opt, mine[1:]))
        dist.barrier()
        out.ddp_tokens_per_s.append(N * tokens / timed_steps(ddp, ddp_opt, mine[1:]))  # the group's tokens
        report_progress(r + 1, job.rounds, "weak scaling")
    del ddp, ddp_opt
    return out
