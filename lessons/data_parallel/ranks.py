"""Lesson 07's rank functions: data parallelism written out, DDP, accumulation with no_sync, buckets.

Launched from notebooks/07_data_parallel.ipynb through the section modules, or by hand (the config is the
lesson's Settings; fields left out keep their defaults):

    $ python -m labtools.parallel make-job lessons.data_parallel.ranks:equivalence '{"steps": 20}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker RUN/job.json

`single_process_losses` runs in the launching process: the reference the ranks are compared with.
"""

import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.keys import Key
from labtools.layout import collective_bytes
from labtools.optim import param_groups
from labtools.parallel.comm import DDPCommCounter, WireBytes, ring_all_reduce
from labtools.parallel.toolkit import (accumulate, build_gpt, global_batch, mean_over_ranks, rank_rows,
                                       report_progress, train_step, world_size)
from lessons.data_parallel import Settings


def naive_data_parallel_grads(model: torch.nn.Module, X: torch.Tensor, Y: torch.Tensor) -> None:
    """Data parallelism written out: each rank back-propagates its own shard, then every gradient is summed
    over the ranks (all_reduce) and divided by the number of ranks — the gradient of the mean loss over the
    global batch. One collective per parameter: DDP does the same arithmetic, bucketed and overlapped."""
    _, loss = model(X, Y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # SUM over ranks
        p.grad /= world_size()


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _adamw(model: torch.nn.Module, job: Settings) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, 0.1), lr=job.lr, betas=(0.9, 0.95))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters()]


WIRE_REPEATS = 5


class Sent(Key):
    """What the equivalence run sends WIRE_REPEATS times while the loopback interface's bytes are counted."""
    RING = "ring"              # the written-out ring all-reduce
    ALL_REDUCE = "all_reduce"  # dist.all_reduce
    DDP_STEP = "ddp_step"      # a DDP backward: its bucketed all-reduces


@dataclass(frozen=True)
class DDPRun:
    """job.steps AdamW steps of DDP: the global loss per step, and DDP's gradient against one process's at a few."""
    losses: list[float]
    grad_diffs: dict[int, float]  # step (from 0) -> max |DDP's gradient − one process's| ÷ its largest entry


@dataclass(frozen=True)
class EquivalenceResult:
    """One rank of the equivalence run: its gradients against one process's on the whole batch, the written-out ring
    against dist.all_reduce, what they sent, and a DDP training run."""
    naive_max_diff: float       # max |Δg|: the all-reduce written out vs one process
    ddp_max_diff: float         # max |Δg|: DDP vs one process
    ring_max_diff: float        # max |Δ|: the written-out ring vs dist.all_reduce
    ring_bytes_sent: int        # bytes this rank handed to the ring
    ring_bytes_formula: float   # 2(N−1)/N × the bytes all-reduced
    grad_bytes: int             # the model's gradient, in bytes
    ddp_allreduce_bytes: int    # bytes DDP's buckets all-reduced in one backward
    ddp_buckets: int            # buckets all-reduced in that backward
    ddp_run: DDPRun
    wire: dict[Sent, float] | None  # bytes on the loopback interface per repetition, all ranks; None: not measurable


def equivalence(job: Settings) -> EquivalenceResult:
    """N ranks × batch B against one process × batch N·B: gradients (naive all-reduce and DDP), the ring
    all-reduce against dist.all_reduce, and job.steps AdamW steps of DDP (the global loss per step)."""
    N = world_size()
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), N * job.batch_size)

    reference = build_gpt(job)  # every rank computes the one-process gradient on the whole batch
    reference(X, Y)[1].backward()
    ref_grads = _grads(reference)

    naive = build_gpt(job)
    naive_data_parallel_grads(naive, rank_rows(X), rank_rows(Y))

    counter = DDPCommCounter()
    ddp = DDP(build_gpt(job))
    ddp.register_comm_hook(None, counter.hook)
    ddp(rank_rows(X), rank_rows(Y))[1].backward()
    grads = [g.clone() for g in _grads(ddp)]
    ddp_bytes, ddp_buckets = counter.bytes, counter.calls  # one backward's (the wire repeats more below)

    local = torch.cat([p.grad.flatten() for p in naive.parameters()]) * N  # a summed gradient, once more
    ring, torch_sum = local.clone(), local.clone()
    sent = ring_all_reduce(ring)
    dist.all_reduce(torch_sum)
    # Bytes on the loopback interface, all ranks together (gloo ranks only), over WIRE_REPEATS repetitions of each:
    # other local traffic (a notebook's messages) and barrier bytes shrink relative to the collective's.
    with WireBytes() as ring_wire:
        for _ in range(WIRE_REPEATS):
            ring_all_reduce(local.clone())
    with WireBytes() as torch_wire:
        for _ in range(WIRE_REPEATS):
            dist.all_reduce(local.clone())
    with WireBytes() as ddp_wire:
        for _ in range(WIRE_REPEATS):
            ddp(rank_rows(X), rank_rows(Y))[1].backward()
    wire = {Sent.RING: ring_wire.bytes, Sent.ALL_REDUCE: torch_wire.bytes, Sent.DDP_STEP: ddp_wire.bytes}
    return EquivalenceResult(
        naive_max_diff=_max_diff(_grads(naive), ref_grads), ddp_max_diff=_max_diff(grads, ref_grads),
        ring_max_diff=(ring - torch_sum).abs().max().item(), ring_bytes_sent=sent,
        ring_bytes_formula=collective_bytes("all_reduce", local.numel() * local.element_size(), N),
        grad_bytes=sum(p.numel() * p.element_size() for p in ddp.parameters()),
        ddp_allreduce_bytes=ddp_bytes, ddp_buckets=ddp_buckets, ddp_run=_train_ddp(job),
        wire=None if None in wire.values() else {k: v / WIRE_REPEATS for k, v in wire.items()})


TRAJECTORY_CHECKS = 4  # steps of the DDP run at which its gradients are compared with one process's


def _train_ddp(job: Settings) -> DDPRun:
    """job.steps AdamW steps with DDP, each rank on its rows of the same global batches: the global loss per step,
    and at TRAJECTORY_CHECKS steps spread over the run the largest difference between DDP's gradient and the
    gradient one process computes on the whole batch at the same weights, relative to that gradient's largest entry
    (the equivalence along the trajectory, which rounding cannot make flaky the way two separately trained loss
    curves can)."""
    model = DDP(build_gpt(job))
    opt = _adamw(model.module, job)
    reference = build_gpt(job)
    check_at = {round(i * (job.steps - 1) / (TRAJECTORY_CHECKS - 1)) for i in range(TRAJECTORY_CHECKS)}
    g = torch.Generator().manual_seed(job.seed + 1)
    losses, grad_diffs = [], {}
    for step in range(job.steps):
        X, Y = global_batch(job, g, world_size() * job.batch_size)
        loss = accumulate(model, [(rank_rows(X), rank_rows(Y))])
        if step in check_at:
            reference.load_state_dict(model.module.state_dict())
            reference.zero_grad(set_to_none=True)
            reference(X, Y)[1].backward()
            largest = max(t.abs().max().item() for t in _grads(reference))
            grad_diffs[step] = _max_diff(_grads(model.module), _grads(reference)) / largest
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(mean_over_ranks(loss))
        report_progress(step + 1, job.steps, "DDP")
    return DDPRun(losses=losses, grad_diffs=grad_diffs)


def single_process_losses(job: Settings, world: int, micro_batches: int = 1) -> list[float]:
    """The same steps as _train_ddp in one process on the whole world × batch_size rows (run by the launcher);
    with micro_batches = world, accumulated in the blocks the ranks hold: DDP's arithmetic in another order."""
    model = build_gpt(job)
    opt = _adamw(model, job)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses = []
    for _ in range(job.steps):
        X, Y = global_batch(job, g, world * job.batch_size)
        losses.append(train_step(model, opt, list(zip(X.chunk(micro_batches), Y.chunk(micro_batches)))))
    return losses


class Accumulate(Key):
    """How the accumulation experiment runs G micro-batches through DDP."""
    NO_SYNC = "no_sync"                                # no_sync() on the first G − 1, each loss ÷ G
    SYNC_EVERY_MICRO_BATCH = "sync_every_micro_batch"  # no no_sync(): an all-reduce after every micro-batch
    SUM_BUG = "no_sync_sum_bug"                        # no_sync(), but the losses not divided by G


@dataclass(frozen=True)
class AccumulatedGrads:
    """One way of accumulating: what DDP all-reduced, and the gradient against one process on the whole batch."""
    allreduce_calls: int
    allreduce_bytes: int
    max_diff: float    # max |Δg| against one process
    norm_ratio: float  # ‖g‖ ÷ ‖one process's g‖


@dataclass(frozen=True)
class BucketCount:
    """DDP's buckets in one backward (after it rebuilt them) at one bucket_cap_mb."""
    cap_mb: float
    buckets: int             # buckets all-reduced
    bucket_bytes: list[int]  # each bucket's bytes, in the order they were all-reduced


@dataclass(frozen=True)
class PanelRun:
    """The panel's DDP run: per step, the global loss, DDP's all-reduces and the seconds it took."""
    losses: list[float]
    allreduce_calls: list[int]
    seconds: list[float]
    tokens_per_step: int  # N ranks × batch × G micro-batches × block size


@dataclass(frozen=True)
class AccumulationResult:
    """One rank of the accumulation run: each way of accumulating, DDP's buckets per bucket size (in
    job.bucket_caps_mb's order), and the panel's first run."""
    accumulated: dict[Accumulate, AccumulatedGrads]
    buckets: list[BucketCount]
    grad_bytes: int  # the model's gradient, in bytes
    panel: PanelRun


def accumulation(job: Settings) -> AccumulationResult:
    """Gradient accumulation under DDP: all-reduces per step with and without no_sync(), the gradient with the
    right and the wrong loss normalisation, buckets per step for several bucket_cap_mb, and the panel's run at the
    job's accumulation and bucket size."""
    N, k = world_size(), job.accum_k
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), N * job.batch_size * k)
    micro = [(rank_rows(X, i, k), rank_rows(Y, i, k)) for i in range(k)]

    reference = build_gpt(job)
    reference(X, Y)[1].backward()  # one process, all N·B·k rows: what accumulation must reproduce
    ref_grads = _grads(reference)
    ref_norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in ref_grads])).item()

    accumulated = {}
    for name, no_sync, normalize in ((Accumulate.NO_SYNC, True, True), (Accumulate.SYNC_EVERY_MICRO_BATCH, False, True),
                                     (Accumulate.SUM_BUG, True, False)):
        counter = DDPCommCounter()
        model = DDP(build_gpt(job))
        model.register_comm_hook(None, counter.hook)
        accumulate(model, micro, normalize=normalize, no_sync=no_sync)
        norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in _grads(model)])).item()
        accumulated[name] = AccumulatedGrads(allreduce_calls=counter.calls, allreduce_bytes=counter.bytes,
                                             max_diff=_max_diff(_grads(model), ref_grads), norm_ratio=norm / ref_norm)
    buckets = []
    for cap in job.bucket_caps_mb:
        counter = DDPCommCounter()
        model = DDP(build_gpt(job), bucket_cap_mb=cap)
        model.register_comm_hook(None, counter.hook)
        for _ in range(2):  # DDP re-builds its buckets after the first backward: count the second
            counter.reset()
            model(*micro[0])[1].backward()
        buckets.append(BucketCount(cap_mb=cap, buckets=counter.calls, bucket_bytes=counter.bucket_bytes))
    # the panel's first setting, run here: the notebook's panel then opens without a launch of its own
    return AccumulationResult(accumulated=accumulated, buckets=buckets,
                              grad_bytes=sum(g.numel() * g.element_size() for g in ref_grads),
                              panel=panel_run(panel_job(job, job.accum_k, job.bucket_cap_mb)))


def panel_job(job: Settings, accum_k: int, bucket_cap_mb: float) -> Settings:
    """The panel's run of a setting: half the lesson's steps, at least 5."""
    return replace(job, accum_k=accum_k, bucket_cap_mb=bucket_cap_mb, steps=max(5, job.steps // 2))


def panel_run(job: Settings) -> PanelRun:
    """The panel's run: DDP with accumulation (no_sync) and a bucket size; loss, all-reduces and time per step."""
    N, k = world_size(), job.accum_k
    model = DDP(build_gpt(job), bucket_cap_mb=job.bucket_cap_mb)
    counter = DDPCommCounter()
    model.register_comm_hook(None, counter.hook)
    opt = _adamw(model.module, job)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses, calls, seconds = [], [], []
    for step in range(job.steps):
        t0 = time.perf_counter()
        counter.reset()
        X, Y = global_batch(job, g, N * job.batch_size * k)
        losses.append(train_step(model, opt, [(rank_rows(X, i, k), rank_rows(Y, i, k)) for i in range(k)]))
        calls.append(counter.calls)
        seconds.append(time.perf_counter() - t0)
        report_progress(step + 1, job.steps)
    return PanelRun(losses=losses, allreduce_calls=calls, seconds=seconds,
                    tokens_per_step=N * job.batch_size * k * job.block_size)
