"""Pipeline parallelism for the lab's GPT: stages, GPipe and 1F1B written out over send/recv, PyTorch's schedules,
and every forward and backward timed.

    stages = gpt_stages(model, p * v)                       # stage s: its blocks; embeddings on 0, head on the last
    timer = ActionTimer(pad_s={"forward": 0.02, "backward": 0.04})   # optional: simulated compute
    loss = run_written_out(schedule_order("1f1b", p, m)[rank], stages, X, Y, m, timer)    # learning version
    sched, local = torch_schedule("1f1b", stages, p, m, timer)                                # the real one
    loss = step_torch(sched, local, X, Y)

Written out (run_written_out): each forward receives its input from the previous stage's rank (dist.recv), runs,
and sends its output on (dist.isend); each backward receives the gradient of its output from the next stage,
back-propagates, and sends its input's gradient back. Naive — blocking receives, no overlap — and exact.

Simulated compute: an ActionTimer with pad_s sleeps after each action until it has lasted a fixed time, so ranks
that share CPU cores still show the schedule's own timeline (a sleeping rank frees its core). Without pad_s the
timeline is real compute. SentBytes counts the bytes a schedule's stages hand to the backend to send.
labtools.model stays free of torch.distributed: this module cuts a GPT from outside.
Introduced in notebooks/09_pipeline_parallel.ipynb.
"""

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labtools.model import GPT
from labtools.pipeline import LETTERS, Action, Schedule

TORCH_SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE, Schedule.ZBV)


def check_pipeline(n_layer: int, p: int, m: int, v: int = 1) -> None:
    """ValueError before any process starts: p ≥ 2 stages, m ≥ 1 micro-batches, v ≥ 1, and the layers must split
    evenly into p·v stages of at least one layer."""
    for name, value, lo in (("p (pipeline stages)", p, 2), ("m (micro-batches)", m, 1), ("v (stages per rank)", v, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    if p * v > n_layer:
        raise ValueError(f"p · v = {p * v} stages need at least as many layers, the model has {n_layer}")
    if n_layer % (p * v):
        raise ValueError(f"the {n_layer} layers must split evenly into p · v = {p} · {v} = {p * v} stages")


class GPTStage(nn.Module):
    """Stage `index` of a GPT cut into n stages: token + position embeddings on the first, a run of blocks, the
    final LayerNorm and the LM head on the last. Its modules are the GPT's own (the same parameters)."""

    def __init__(self, gpt: GPT, index: int, n: int):
        super().__init__()
        L = gpt.config.n_layer // n
        self.index, self.is_first, self.is_last = index, index == 0, index == n - 1
        self.width = gpt.config.n_embd  # C of the activations passed between stages
        if self.is_first:
            self.wte, self.wpe = gpt.transformer.wte, gpt.transformer.wpe
        self.h = nn.ModuleList(gpt.transformer.h[index * L:(index + 1) * L])
        if self.is_last:
            self.ln_f, self.lm_head = gpt.transformer.ln_f, gpt.lm_head

    def forward(self, x):
        if self.is_first:  # token ids (B, T) -> residual stream (B, T, C)
            x = self.wte(x) + self.wpe(torch.arange(x.size(1), device=x.device))
        for block in self.h:
            x = block(x)
        if self.is_last:   # (B, T, C) -> logits (B, T, V)
            x = self.lm_head(self.ln_f(x))
        return x


def gpt_stages(gpt: GPT, n: int) -> list[GPTStage]:
    """The GPT cut into n stages (each rank keeps the ones it runs). Needs untied embeddings: the first and the
    last stage may sit on different ranks, and a shared matrix cannot."""
    if not isinstance(n, int) or n < 1 or gpt.config.n_layer % n:
        raise ValueError(f"the {gpt.config.n_layer} layers must split evenly into n = {n!r} stages")
    if n > 1 and gpt.config.tie_embeddings:
        raise ValueError("a pipeline needs GPTConfig(tie_embeddings=False): the embedding (first stage) and the LM "
                         "head (last stage) cannot share one matrix across ranks")
    return [GPTStage(gpt, s, n) for s in range(n)]


def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of one micro-batch (the last stage's loss)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class ActionTimer:
    """Records (row, kind, mb, stage, start, end) of every timed action, in ms of time.monotonic() — one clock for
    every process on a machine, so timelines gathered from ranks line up (shift them by the earliest start).
    With pad_s {kind: seconds} each action is padded by sleeping to that duration (simulated compute); overruns
    counts the actions whose real compute took longer than their pad."""

    def __init__(self, row: int, pad_s: dict[str, float] | None = None, device: torch.device | None = None):
        self.row, self.pad_s, self.device = row, pad_s or {}, device
        self.intervals: list[dict] = []
        self.overruns = 0

    def reset(self) -> None:
        """Start a new timeline."""
        self.intervals, self.overruns = [], 0

    def _sync(self):
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, kind: str, mb: int, stage: int, fn):
        self._sync()
        t0 = time.monotonic()
        out = fn()
        self._sync()
        pad = self.pad_s.get(kind)
        if pad is not None:
            left = pad - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
            else:
                self.overruns += 1
        self.intervals.append({"row": self.row, "kind": kind, "mb": mb, "stage": stage,
                               "label": f"{LETTERS[kind]}{mb}", "start": t0 * 1e3, "end": time.monotonic() * 1e3})
        return out


# --- written out -------------------------------------------------------------------------------------------------

def run_written_out(order: Sequence[Action], stages: Sequence[GPTStage], X: torch.Tensor, Y: torch.Tensor, m: int,
                    timer: ActionTimer, p: int | None = None) -> float | None:
    """Run one rank's actions of a GPipe or 1F1B order over point-to-point messages (stage s on rank s mod p);
    gradients accumulate in the stages' .grad. Returns the batch's mean loss on the last stage, else None."""
    p = p or dist.get_world_size()
    X_mb, Y_mb = X.chunk(m), Y.chunk(m)
    B, T, C = X_mb[0].size(0), X.size(1), stages[0].width
    kept: dict[tuple, tuple] = {}     # (mb, stage) -> (input, output or loss) until its backward
    sends, loss_sum = [], 0.0
    for a in order:
        stage = stages[a.stage]
        if a.kind == "F":
            if stage.is_first:
                inp = X_mb[a.mb]
            else:
                inp = torch.empty(B, T, C, device=X.device)
                dist.recv(inp, src=(a.stage - 1) % p)
                inp.requires_grad_()
            out = timer.time("forward", a.mb, a.stage, lambda: stage(inp))
            if stage.is_last:
                out = pipeline_loss(out, Y_mb[a.mb]) / m  # each micro-batch is 1/m of the batch
                loss_sum += out.item()
            else:
                sends.append(dist.isend(out.detach(), dst=(a.stage + 1) % p))
            kept[(a.mb, a.stage)] = (inp, out)
        else:
            inp, out = kept.pop((a.mb, a.stage))
            if stage.is_last:
                timer.time("backward", a.mb, a.stage, out.backward)
            else:
                grad = torch.empty_like(out)
                dist.recv(grad, src=(a.stage + 1) % p)
                timer.time("backward", a.mb, a.stage, lambda: out.backward(grad))
            if not stage.is_first:
                sends.append(dist.isend(inp.grad, dst=(a.stage - 1) % p))
    for work in sends:
        work.wait()
    return loss_sum if any(a.stage == len(stages) - 1 for a in order) else None


# --- PyTorch's schedules ----------------------------------------------------------------------------------------

def local_stage_ids(schedule: str, rank: int, p: int, v: int) -> list[int]:
    """The stages a rank runs: its own for GPipe/1F1B; r, r + p, … interleaved; r and 2p − 1 − r for ZBV's V shape."""
    if not Schedule(schedule).chunked:
        return [rank]
    if schedule == Schedule.ZBV:
        return [rank, 2 * p - 1 - rank]
    return [rank + k * p for k in range(v)]


def torch_schedule(schedule: str, stages: Sequence[GPTStage], p: int, m: int, timer: ActionTimer | None = None,
                   device: torch.device | None = None, v: int = 2):
    """(schedule object, local PipelineStages) of torch.distributed.pipelining for this rank, its stage methods
    wrapped to time every forward and backward (Schedule1F1B emits no profiler labels of its own)."""
    from torch.distributed import pipelining as pl
    classes = {Schedule.GPIPE: pl.ScheduleGPipe, Schedule.ONE_F_ONE_B: pl.Schedule1F1B,
               Schedule.INTERLEAVED: pl.ScheduleInterleaved1F1B, Schedule.ZERO_BUBBLE: pl.ScheduleInterleavedZeroBubble,
               Schedule.ZBV: pl.ScheduleZBVZeroBubble}
    if schedule not in classes:
        raise ValueError(f"schedule must be one of {tuple(str(s) for s in TORCH_SCHEDULES)}, got {schedule!r}")
    device = device or torch.device("cpu")
    ids = local_stage_ids(schedule, dist.get_rank(), p, v)
    local = [pl.PipelineStage(stages[s], s, len(stages), device) for s in ids]
    if timer is not None:
        for st in local:
            _instrument(st, timer)
    multi = Schedule(schedule).chunked
    sched = classes[schedule](local if multi else local[0], n_microbatches=m, loss_fn=pipeline_loss)
    return sched, local


def _instrument(stage, timer: ActionTimer) -> None:
    fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(mb, *args, **kwargs):
        return timer.time("forward", mb, stage.stage_index, lambda: fwd(mb, *args, **kwargs))

    def backward_one_chunk(mb, *args, **kwargs):
        kind = "backward" if kwargs.get("full_backward", True) else "backward_input"
        return timer.time(kind, mb, stage.stage_index, lambda: bwd(mb, *args, **kwargs))

    def backward_weight_one_chunk(mb, *args, **kwargs):
        return timer.time("backward_weight", mb, stage.stage_index, lambda: bwd_w(mb, *args, **kwargs))

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def step_torch(sched, local, X: torch.Tensor, Y: torch.Tensor) -> float | None:
    """One training step (forward + backward; the caller steps the optimizer). The first stage feeds X, the last
    gets the targets; returns the batch's mean loss on the rank holding the last stage, else None."""
    first = any(st.is_first for st in local)
    last = any(st.is_last for st in local)
    losses: list[torch.Tensor] = []
    kwargs = dict(target=Y, losses=losses) if last else {}
    sched.step(*((X,) if first else ()), **kwargs)
    return torch.stack(losses).mean().item() if last else None


class SentBytes:
    """Count the bytes of the tensors a PipelineStage hands to its schedule to send (get_fwd_send_ops and
    get_bwd_send_ops: activations forward, gradients backward) inside a `with` block."""

    def __init__(self, local):
        self.local, self.bytes = local, 0

    def __enter__(self):
        for st in self.local:
            for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
                orig = getattr(st, name)

                def counted(*args, _orig=orig, **kwargs):
                    ops = _orig(*args, **kwargs)
                    self.bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
                    return ops
                setattr(st, name, counted)
        return self

    def __exit__(self, *exc):
        for st in self.local:
            for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
                del st.__dict__[name]  # back to the class's method
        return False
