"""Lesson 16's rank function: this machine measured for the planner, and the runs it predicts.

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
from labtools.keys import Key
from labtools.optim import param_groups
from labtools.parallel.toolkit import (build_gpt, device, global_batch, rank, rank_rows, report_progress, timed_steps,
                                       world_size)


# One bucket for all the gradients: DDP all-reduces them once backward is done, so the all-reduce cannot hide
# behind backward and the planner's dp_overlap = 0 describes what runs. (With DDP's default buckets, the all-reduces
# that do overlap backward compete with it for this machine's two cores, and a rank that must answer a ring step
# waits for the scheduler: they cost more than the same bytes sent alone.)
BUCKET_MB = 1024


class Collective(Key):
    """The collectives the planner's communication is calibrated on (as labtools.layout names them)."""
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"


KINDS = tuple(Collective)


class Run(Key):
    """The runs the calibrated planner predicts: a data-parallel step (DDP, one all-reduce) and the same step with
    sharded optimizer state (ZeRO-2: a reduce-scatter and an all-gather)."""
    DDP = "ddp"
    ZERO2 = "zero2"


@dataclass(frozen=True, kw_only=True)
class CalibrationJob(LabConfig):
    rounds: int = 5
    matmul_sizes: tuple = (128, 256)
    repeats: int = 5                                  # collectives timed per message size and round
    message_sizes: tuple = (2**14, 2**17, 2**20, 2**22)  # bytes: the collectives that calibrate α and β


def _collective_s(kind: Collective, n_bytes: int, repeats: int) -> float:
    """Seconds per collective over n_bytes of fp32 (the all-reduced tensor, the all-gather's output, the
    reduce-scatter's input), every rank together."""
    N, dev = world_size(), device()
    n = max(N, n_bytes // 4 // N * N)
    whole, part = torch.zeros(n, device=dev), torch.zeros(n // N, device=dev)
    run = {Collective.ALL_REDUCE: lambda: dist.all_reduce(whole),
           Collective.ALL_GATHER: lambda: dist.all_gather_into_tensor(whole, part),
           Collective.REDUCE_SCATTER: lambda: dist.reduce_scatter_tensor(part, whole)}[kind]
    run()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


class ShardedStep:
    """A data-parallel step written out with sharded optimizer state (ZeRO stage 2): after backward each rank
    reduce-scatters the flattened gradients and keeps the average of its 1/N of them, updates its 1/N of the weights
    with AdamW (state for that share only), and all-gathers the updated weights back into every rank's model. Two
    collectives where DDP has one all-reduce: the same bytes on a ring, but each measured on its own here."""

    def __init__(self, model: torch.nn.Module, lr: float):
        self.model, self.params = model, [p for p in model.parameters()]
        N = world_size()
        self.n = sum(p.numel() for p in self.params)
        self.padded = -(-self.n // N) * N
        flat = torch.zeros(self.padded, device=self.params[0].device)
        flat[:self.n] = torch.cat([p.detach().flatten() for p in self.params])
        share = self.padded // N
        self.shard = torch.nn.Parameter(flat[rank() * share:(rank() + 1) * share].clone())
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=0.1)
        self.grads, self.weights = torch.zeros_like(flat), flat

    def step(self, X: torch.Tensor, Y: torch.Tensor, communicate: bool = True) -> None:
        """One step; communicate=False does the same work without the two collectives (this rank's own share of its
        own gradients, its weights left as they are): the step's compute, with nothing sent."""
        _, loss = self.model(X, Y)
        loss.backward()
        torch.cat([p.grad.flatten() for p in self.params], out=self.grads[:self.n])
        grad = torch.empty_like(self.shard)
        if communicate:
            dist.reduce_scatter_tensor(grad, self.grads)
        else:
            share = self.shard.numel()
            grad.copy_(self.grads[rank() * share:(rank() + 1) * share])
        self.shard.grad = grad.div_(world_size())
        self.optimizer.step()
        if communicate:
            dist.all_gather_into_tensor(self.weights, self.shard.detach())
        torch.nn.utils.vector_to_parameters(self.weights[:self.n], self.params)
        for p in self.params:
            p.grad = None

    def timed(self, batches, communicate: bool = True) -> float:
        """Seconds per step; without communication every step ends at a barrier, as a synchronous step ends."""
        t0 = time.perf_counter()
        for X, Y in batches:
            self.step(X, Y, communicate)
            if not communicate:
                dist.barrier()
        return (time.perf_counter() - t0) / len(batches)


@dataclass(frozen=True)
class Timed:
    """One quantity measured once per round, and its median (None where this rank did not measure it)."""
    rounds: list[float]
    median: float | None


def _timed(rounds: list[float]) -> Timed:
    return Timed(rounds=rounds, median=statistics.median(rounds) if rounds else None)


@dataclass(frozen=True)
class RunSteps:
    """One predicted run, seconds per step."""
    step: Timed      # the run: its step, its collectives included
    compute: Timed   # the same step with nothing sent, every rank at once (the compute the planner is given)


@dataclass(frozen=True)
class Calibration:
    """What a rank measured for the planner, and the runs it predicts."""
    peak: Timed          # the matmul benchmark's FLOP/s (rank 0 alone; empty on the others)
    solo: Timed          # seconds of rank 0's DDP step alone, the others waiting (empty on the others)
    runs: dict[Run, RunSteps]
    collectives: dict[Collective, dict[int, float]]   # median seconds, by message size in bytes
    n_params: int
    world: int
    vocab: int
    bucket_cap_mb: float  # DDP's bucket: one, holding every gradient


def calibrate(job: CalibrationJob) -> Calibration:
    """What the planner is calibrated on, and the runs it predicts, in alternating rounds. Calibration: three
    collectives at several message sizes, none the size the runs send (their α and β); each run's step with nothing
    sent, every rank at once (the compute the planner cannot predict at this scale); and, for comparison, the
    matmul peak and one training step of rank 0 alone (the others waiting).
    Predicted: a data-parallel step (DDP, one bucket: one all-reduce after backward) and the same step with sharded
    optimizer state (ShardedStep: a reduce-scatter and an all-gather), job.batch_size rows per rank. One thread per
    rank (OMP_NUM_THREADS=1, as torchrun sets)."""
    dev, N = device(), world_size()
    g = torch.Generator().manual_seed(job.seed)
    rows = [global_batch(job, g, N * job.batch_size) for _ in range(job.steps + 1)]
    mine = [(rank_rows(X), rank_rows(Y)) for X, Y in rows]
    solo = build_gpt(job)
    solo_opt = torch.optim.AdamW(param_groups(solo, 0.1), lr=job.lr)
    ddp = DDP(build_gpt(job), bucket_cap_mb=BUCKET_MB)
    ddp_opt = torch.optim.AdamW(param_groups(ddp.module, 0.1), lr=job.lr)
    sharded = ShardedStep(build_gpt(job), job.lr)
    n_params = sum(p.numel() for p in solo.parameters())
    timed_steps(ddp, ddp_opt, mine[:1])  # warm-up: DDP's first step builds its buckets
    sharded.timed(mine[:1])
    if rank() == 0:
        timed_steps(solo, solo_opt, mine[:1])
    peak, solo_s = [], []
    step_s = {run: [] for run in Run}     # each run's step, its collectives included, per round
    compute_s = {run: [] for run in Run}  # ... with nothing sent, every rank at once
    collectives = {kind: {b: [] for b in job.message_sizes} for kind in KINDS}
    for r in range(job.rounds):
        dist.barrier()
        if rank() == 0:
            peak.append(profiling.matmul_peak(job.matmul_sizes, dev)["fp32"]["peak"])
            solo_s.append(timed_steps(solo, solo_opt, mine[1:]))
        dist.barrier()
        with ddp.no_sync():  # every rank computes at once, each step waits for the slowest, nothing sent
            compute_s[Run.DDP].append(timed_steps(ddp, ddp_opt, mine[1:], wait=True))
        compute_s[Run.ZERO2].append(sharded.timed(mine[1:], communicate=False))
        for kind in KINDS:
            for b in job.message_sizes:
                collectives[kind][b].append(_collective_s(kind, b, job.repeats))
        dist.barrier()
        step_s[Run.DDP].append(timed_steps(ddp, ddp_opt, mine[1:]))
        dist.barrier()
        step_s[Run.ZERO2].append(sharded.timed(mine[1:]))
        report_progress(r + 1, job.rounds, "calibration rounds")
    return Calibration(peak=_timed(peak), solo=_timed(solo_s),
                       runs={run: RunSteps(step=_timed(step_s[run]), compute=_timed(compute_s[run])) for run in Run},
                       collectives={kind: {b: statistics.median(v) for b, v in sizes.items()}
                                    for kind, sizes in collectives.items()},
                       n_params=n_params, world=N, vocab=solo.config.vocab_size,
                       bucket_cap_mb=ddp.bucket_bytes_cap / 2**20)


@dataclass(frozen=True)
class Parity:
    """The sharded step against AdamW in one process, on this rank."""
    max_diff: float   # largest |difference| of any weight after job.steps steps


def sharded_parity(job: CalibrationJob) -> Parity:
    """ShardedStep against one process: job.steps steps on every rank's rows, and AdamW (the same settings, on every
    parameter) on the whole batch in one process; the largest difference of any weight afterwards."""
    N = world_size()
    g = torch.Generator().manual_seed(job.seed)
    rows = [global_batch(job, g, N * job.batch_size) for _ in range(job.steps)]
    sharded = ShardedStep(build_gpt(job), job.lr)
    for X, Y in rows:
        sharded.step(rank_rows(X), rank_rows(Y))
    one = build_gpt(job)
    opt = torch.optim.AdamW(one.parameters(), lr=job.lr, weight_decay=0.1)
    for X, Y in rows:
        _, loss = one(X, Y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return Parity(max_diff=max((a - b).abs().max().item() for a, b in zip(sharded.params, one.parameters())))
