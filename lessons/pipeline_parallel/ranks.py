"""Lesson 09's rank functions: pipeline stages on real ranks — written-out and PyTorch schedules, their gradients
against one process, timed timelines with simulated or real compute, activations held, bytes sent.

Launched from notebooks/09_pipeline_parallel.ipynb through lessons/pipeline_parallel/, or by hand:

    $ python -m labtools.parallel make-job lessons.pipeline_parallel.ranks:parity '{"m": 4}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 4 -m labtools.parallel.worker RUN/job.json

One rank per stage (p = world size); interleaved schedules put v stages on each rank. Each function returns a
dataclass defined beside it (`lesson_run` a PipelineRun holding them all). `single_process_losses` runs in the
launching process: the reference a pipeline's training is compared with.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.memory import SavedTensorTracker, saved_activations
from labtools.parallel.comm import WireBytes
from labtools.parallel.pipeline import (ActionTimer, SentBytes, check_pipeline, gpt_stages, local_stage_ids,
                                        pipeline_loss, run_written_out, step_torch, torch_schedule)
from labtools.parallel.toolkit import (build_gpt, device, global_batch, rank, rank_rows, report_progress, world_size)
from labtools.pipeline import Schedule, decompose, schedule_order
from lessons.pipeline_parallel import Settings

# The case a widely quoted efficiency is about (p = 4, m = 16, 1F1B; section 3's claim tells 15.8% idle from 21.1%).
# Each hop between ranks costs a few ms here, and in 1F1B's steady state the neighbours wait on each other, so that
# latency shows up as bubble, more on a busy machine: at 20 ms a forward, one step measured 17-18% alone and 18-20%
# beside two busy processes (CI once 18.8%); at 40 ms, 16.5% and 17-18% (the less idle of two steps 17.5% once). So
# this case is padded QUOTED_PAD times longer and timed QUOTED_REPEATS times, the least idle step kept.
QUOTED_CASE, QUOTED_PAD, QUOTED_REPEATS = (Schedule.ONE_F_ONE_B, 4, 16), 3, 2
# The same delays add up over a long step: beside make test's unit tests one step of GPipe at p = 4, m = 16 idled
# 0.053 beyond the formula, and ZBV at p = 4, m = 8 measured 10.9% for its list's 5.9%. Runs of LONG_M micro-batches
# or more, and ZBV's, are timed over LONG_REPEATS steps, the least idle kept (a late wake-up only ever adds idle time).
LONG_M, LONG_REPEATS = 8, 2

PARITY_SCHEDULES = (Schedule.WRITTEN_OUT_GPIPE, Schedule.WRITTEN_OUT_1F1B, Schedule.GPIPE, Schedule.ONE_F_ONE_B,
                    Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE, Schedule.ZBV)


def _model(job: Settings):
    return build_gpt(job, tie_embeddings=False)  # embedding and head on different stages


def _batch(job: Settings, seed_offset: int = 0):
    return global_batch(job, torch.Generator().manual_seed(job.seed + seed_offset), job.batch_size)


def _own_params(stages, ids) -> list[torch.nn.Parameter]:
    return [p for s in ids for p in stages[s].parameters()]


def _pad(job: Settings, v: int, scale: float = 1.0) -> dict[str, float] | None:
    if not job.simulate:
        return None
    f, b = scale * job.t_f_ms / 1e3 / v, scale * job.t_b_ms / 1e3 / v
    return {"forward": f, "backward": b, "backward_input": b / 2, "backward_weight": b / 2}


def chunks(schedule: Schedule, v: int) -> int:
    """Chunks of layers (stages) per rank: ZBV's V always has two, the interleaved schedules v, the others one."""
    return 2 if schedule == Schedule.ZBV else v if schedule.chunked else 1


def _run(job: Settings, schedule: Schedule, m: int, X, Y, timer: ActionTimer | None, model=None):
    """Build this rank's stages for a schedule and run one step; (stages, local stage ids, loss or None)."""
    p, v = world_size(), chunks(schedule, job.v)
    model = model or _model(job)
    stages = gpt_stages(model, p * v)
    timer = timer or ActionTimer(rank(), device=device())
    if schedule.written_out:
        order = schedule_order(schedule.order, p, m)[rank()]
        loss = run_written_out(order, stages, X, Y, m, timer, p)
        return stages, [rank()], loss
    sched, local = torch_schedule(schedule, stages, p, m, timer, device(), job.v)
    return stages, [st.stage_index for st in local], step_torch(sched, local, X, Y)


@dataclass(frozen=True)
class ScheduleParity:
    """One schedule's gradients on this rank against one process's, or why it could not run on this backend."""
    ran: bool
    max_grad_diff: float | None = None  # max |Δ gradient| over this rank's stages' parameters (None: did not run)
    loss: float | None = None           # the batch's mean loss, on the rank holding the last stage (else None)
    stages: tuple[int, ...] = ()        # the stages this rank held
    error: str | None = None            # the exception, where it did not run


@dataclass(frozen=True)
class ParityResult:
    """Every schedule of PARITY_SCHEDULES on this rank, against one process on the same batch."""
    schedules: dict[Schedule, ScheduleParity]
    reference_loss: float  # one process's loss on the whole batch


def parity(job: Settings) -> ParityResult:
    """Every schedule's gradients (this rank's stages) against one process on the same batch, at m = job.m.
    A schedule that fails on this backend is reported, not fatal."""
    check_pipeline(job.n_layer, world_size(), job.m, job.v)
    X, Y = _batch(job)
    reference = _model(job)
    _, ref_loss = reference(X, Y)
    ref_loss.backward()
    ref = {id(p): p.grad for p in reference.parameters()}
    out: dict[Schedule, ScheduleParity] = {}
    for i, schedule in enumerate(PARITY_SCHEDULES):
        model = _model(job)
        pairs = dict(zip((id(p) for p in model.parameters()), (id(p) for p in reference.parameters())))
        try:
            stages, ids, loss = _run(job, schedule, job.m, X, Y, None, model)
            diff = max((p.grad - ref[pairs[id(p)]]).abs().max().item() for p in _own_params(stages, ids))
            out[schedule] = ScheduleParity(ran=True, max_grad_diff=diff, loss=loss, stages=tuple(ids))
        except Exception as e:  # noqa: BLE001 - "say which ran": a schedule this backend cannot run is a finding
            out[schedule] = ScheduleParity(ran=False, error=f"{type(e).__name__}: {e}")
        dist.barrier()
        report_progress(i + 1, len(PARITY_SCHEDULES), schedule)
    return ParityResult(schedules=out, reference_loss=ref_loss.item())


def runs_at(schedule: Schedule, p: int, m: int) -> bool:
    """torch's Schedule1F1B needs m >= p; interleaving (here) m a multiple of p; ZBV runs any m."""
    if schedule == Schedule.ONE_F_ONE_B:
        return m >= p
    if schedule == Schedule.ZBV:
        return True
    if schedule.chunked:
        return m % p == 0
    return True


@dataclass(frozen=True)
class Timeline:
    """One timed step of a schedule on p ranks with m micro-batches. intervals: every rank's actions as
    labtools.pipeline draws and decomposes them ({row (rank), kind, mb, stage, label, start, end}, in ms from the
    step's first action); pipeline_order: for the schedules torch runs from a list, each rank's list ("3F0": stage,
    kind, micro-batch; None for an empty slot)."""
    schedule: Schedule
    p: int
    m: int
    intervals: list[dict]
    pipeline_order: list[list[str | None]] | None = None


@dataclass(frozen=True)
class TimelinesResult:
    """The timed steps of every schedule and m, gathered on rank 0."""
    timelines: list[Timeline]  # rank 0's: every rank's intervals; empty on the other ranks
    overruns: int              # this rank's actions whose real compute took longer than their simulated time
    simulated: bool            # actions padded to simulated durations (False: real compute)


def timelines(job: Settings) -> TimelinesResult:
    """For each schedule and m: one step after a warm-up step (the least idle of LONG_REPEATS for long runs and ZBV;
    the quoted case padded QUOTED_PAD times longer, the least idle of QUOTED_REPEATS), every action timed; the intervals of all ranks
    gathered to rank 0 (ms from the step's first action, on the machine's monotonic clock), and for the schedules
    torch runs from a list of actions (interleaved, zero-bubble) that list ("3F0": stage, kind, micro-batch)."""
    p = world_size()
    check_pipeline(job.n_layer, p, 1, job.v)
    X, Y = _batch(job)
    runs = [(Schedule(s), m) for s in job.schedules for m in job.micro_batches if runs_at(Schedule(s), p, m)]
    if job.zero_bubble and Schedule.ZBV not in job.schedules:
        runs.append((Schedule.ZBV, 2 * p))  # section 4's picture: the V filled (m >= 2p − 1)
    out, overruns = [], 0
    for i, (schedule, m) in enumerate(runs):
        v = chunks(schedule, job.v)
        model = _model(job)
        stages = gpt_stages(model, p * v)
        quoted = (schedule, p, m) == QUOTED_CASE
        timer = ActionTimer(rank(), _pad(job, v, QUOTED_PAD if quoted else 1.0), device())
        listed = None  # torch's own list of every rank's actions, where its runtime executes one
        if schedule.written_out:
            def step():
                run_written_out(schedule_order(schedule.order, p, m)[rank()], stages, X, Y, m, timer, p)
        else:
            sched, local = torch_schedule(schedule, stages, p, m, timer, device(), job.v)
            if schedule.chunked:
                listed = [[str(a) if a is not None else None for a in sched.pipeline_order[r]] for r in range(p)]

            def step():
                step_torch(sched, local, X, Y)
        pads, timer.pad_s = timer.pad_s, {}
        step()  # warm-up, unpadded: shapes, buffers, first-call costs
        timer.pad_s = pads
        kept = None
        repeats = QUOTED_REPEATS if quoted else LONG_REPEATS if m >= LONG_M or schedule == Schedule.ZBV else 1
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            dist.barrier()
            timer.reset()
            step()
            overruns += timer.overruns
            gathered = [None] * p
            dist.all_gather_object(gathered, timer.intervals)
            intervals = [iv for ivs in gathered for iv in ivs]
            t0 = min(iv["start"] for iv in intervals)  # one clock (time.monotonic) on one machine: shift to the start
            timed = [dict(iv, start=iv["start"] - t0, end=iv["end"] - t0) for iv in intervals]
            if kept is None or decompose(timed)["busy"] > decompose(kept)["busy"]:
                kept = timed  # the least disturbed step: a rank that woke late only adds idle time
        out.append(Timeline(schedule=schedule, p=p, m=m, pipeline_order=listed, intervals=kept))
        report_progress(i + 1, len(runs), f"{schedule}, m = {m}")
    return TimelinesResult(timelines=out if rank() == 0 else [], overruns=overruns, simulated=job.simulate)


@dataclass(frozen=True)
class MemoryResult:
    """Activations this rank's stage held for backward, in bytes."""
    per_micro_batch: int          # what one micro-batch through this rank's stage saves
    peak: dict[Schedule, int]     # the most held at once during one step, for GPipe and 1F1B

    def held(self, schedule: Schedule) -> float:
        """The schedule's peak in micro-batches' worth."""
        return self.peak[schedule] / self.per_micro_batch


def memory(job: Settings) -> MemoryResult:
    """Peak bytes autograd holds for backward on this rank during a GPipe and a 1F1B step at m = job.m, and what
    one micro-batch through this rank's stage saves: the peak in micro-batches."""
    p, m = world_size(), job.m
    X, Y = _batch(job)
    model = _model(job)
    stage = gpt_stages(model, p)[rank()]
    x = X[: job.batch_size // m].clone()  # its own storage: a view would count the whole batch's
    if not stage.is_first:  # what this stage's input looks like: the residual stream
        x = torch.randn(x.size(0), x.size(1), job.n_embd, device=X.device, requires_grad=True)
    fn = _LastWithLoss(stage, Y[: job.batch_size // m].clone()) if stage.is_last else stage
    per_mb = sum(t.nbytes for t in saved_activations(lambda: fn(x), exclude=list(model.parameters()))[0])
    peak = {}
    for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        model = _model(job)
        stages = gpt_stages(model, p)
        sched, local = torch_schedule(schedule, stages, p, m, None, device())
        step_torch(sched, local, X, Y)  # warm-up (shape inference allocates and saves nothing for later)
        model.zero_grad(set_to_none=True)
        dist.barrier()
        with SavedTensorTracker(exclude=list(model.parameters())) as tracker:
            step_torch(sched, local, X, Y)
        peak[schedule] = tracker.peak
    return MemoryResult(per_micro_batch=per_mb, peak=peak)


class _LastWithLoss(torch.nn.Module):
    """The last stage with its loss, so a forward saves what the loss saves too."""

    def __init__(self, stage, Y):
        super().__init__()
        self.stage, self.Y = stage, Y

    def forward(self, x):
        return pipeline_loss(self.stage(x), self.Y)


@dataclass(frozen=True)
class TrafficResult:
    """Bytes one training step sends: a 1F1B pipeline step, and a DDP step of the whole model on the same ranks."""
    pipeline_wire: int | None   # over the loopback interface, every process (None: no counter here, or NCCL)
    pipeline_sent_counted: int  # the tensors this rank's stages handed to the backend to send
    ddp_wire: int | None        # DDP's step over the loopback interface (None as above)
    param_bytes: int            # the whole model's parameters
    activation_bytes: int       # one micro-batch's activation, b·s·h·4


def traffic(job: Settings) -> TrafficResult:
    """Bytes on the wire (loopback) for one 1F1B step at m = job.m, and for one DDP step of the whole model on the
    same ranks; with the bytes of the tensors each sends, counted from what torch's schedule passed to gloo."""
    p, m = world_size(), job.m
    X, Y = _batch(job)
    model = _model(job)
    stages = gpt_stages(model, p)
    sched, local = torch_schedule(Schedule.ONE_F_ONE_B, stages, p, m, None, device())
    step_torch(sched, local, X, Y)  # warm-up: shape inference sends metadata once
    with SentBytes(local) as counted, WireBytes() as wire:
        step_torch(sched, local, X, Y)
    ddp = DDP(_model(job))
    ddp(rank_rows(X), rank_rows(Y))[1].backward()  # warm-up: DDP builds its buckets
    with WireBytes() as ddp_wire:
        ddp(rank_rows(X), rank_rows(Y))[1].backward()
    return TrafficResult(pipeline_wire=wire.bytes, pipeline_sent_counted=counted.bytes, ddp_wire=ddp_wire.bytes,
                         param_bytes=sum(q.numel() * q.element_size() for q in ddp.parameters()),
                         activation_bytes=job.batch_size // m * job.block_size * job.n_embd * 4)


@dataclass(frozen=True)
class TrainingResult:
    """1F1B training: the batch loss per AdamW step, as the last stage's rank computed it (every rank holds it)."""
    losses: list[float]


def training(job: Settings) -> TrainingResult:
    """job.train_steps AdamW steps of 1F1B at m = job.m; the batch loss per step (from the last stage's rank)."""
    p = world_size()
    model = _model(job)
    stages = gpt_stages(model, p)
    sched, local = torch_schedule(Schedule.ONE_F_ONE_B, stages, p, job.m, None, device())
    own = _own_params(stages, local_stage_ids(Schedule.ONE_F_ONE_B, rank(), p, 1))
    opt = torch.optim.AdamW(own, lr=job.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses = []
    for step in range(job.train_steps):
        X, Y = global_batch(job, g, job.batch_size)
        loss = step_torch(sched, local, X, Y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64)
        dist.broadcast(t, src=p - 1)  # the last stage's rank has the loss
        losses.append(t.item())
        report_progress(step + 1, job.train_steps, "1F1B training")
    return TrainingResult(losses=losses)


def single_process_losses(job: Settings) -> list[float]:
    """The same AdamW steps as `training`, in one process on the whole batch (run by the launcher)."""
    model = _model(job)
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses = []
    for _ in range(job.train_steps):
        X, Y = global_batch(job, g, job.batch_size)
        _, loss = model(X, Y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@dataclass(frozen=True)
class PipelineRun:
    """Everything one rank measured at one pipeline depth (lesson_run)."""
    parity: ParityResult
    timelines: list[Timeline]  # as TimelinesResult's: rank 0 holds every rank's, the others none
    overruns: int
    simulated: bool
    memory: MemoryResult
    traffic: TrafficResult
    training: TrainingResult | None  # None where job.train_steps is 0


def lesson_run(job: Settings) -> PipelineRun:
    """Everything the lesson measures at one pipeline depth, in one launch: parity, timelines, memory, traffic and
    training."""
    par = parity(job)
    timed = timelines(job)
    return PipelineRun(parity=par, timelines=timed.timelines, overruns=timed.overruns, simulated=timed.simulated,
                       memory=memory(job), traffic=traffic(job), training=training(job) if job.train_steps else None)
