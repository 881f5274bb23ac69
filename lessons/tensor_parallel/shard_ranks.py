"""Lesson 10, train with yours: the GPT trained on tp real ranks with every block's MLP split by the learner's
my_mlp_shards (sent as source): each rank keeps the shards your function gives it, and the lab's copy and reduce
connect them. Attention stays whole on every rank. The same AdamW steps, model and batches as the one-process run
section 5 compares with (ranks.single_process).

    $ python -m labtools.parallel make-job lessons.tensor_parallel.shard_ranks:train_with_shards '{...}' --run-dir R
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker R/job.json
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from labtools.learner import BOUND_FLOOR_S, LEARNER_ERRORS, load_function, time_bound, where_it_failed
from labtools.parallel.tensor import ColumnParallelLinear, RowParallelLinear
from labtools.parallel.toolkit import build_gpt, global_batch, rank, report_progress, world_size
from lessons.tensor_parallel import Settings


@dataclass(frozen=True)
class ShardJob:
    """The learner's function, sent as source, and the lesson's settings."""
    settings: Settings
    source: str
    name: str = "my_mlp_shards"


@dataclass(frozen=True)
class ShardTraining:
    """The loss per AdamW step (the same on every rank), or the error a rank met."""
    losses: list[float]
    error: str = ""


def _set(param: nn.Parameter, value, what: str) -> None:
    if not isinstance(value, torch.Tensor) or value.shape != param.shape:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"your {what} has shape {shape}; this rank's shard is {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(value)


def split_mlps(model, fn, tp: int, r: int) -> None:
    """Every block's c_fc and c_proj replaced by column- and row-parallel linears holding the shards fn gives."""
    for block in model.transformer.h:
        mlp = block.mlp
        with time_bound(BOUND_FLOOR_S), torch.no_grad():
            W_fc, b_fc, W_proj = fn(mlp.c_fc.weight.detach().clone(), mlp.c_fc.bias.detach().clone(),
                                    mlp.c_proj.weight.detach().clone(), tp, r)
        c_fc, c_proj = ColumnParallelLinear(mlp.c_fc), RowParallelLinear(mlp.c_proj)
        _set(c_fc.weight, W_fc, "W_fc_r")
        _set(c_fc.bias, b_fc, "b_fc_r")
        _set(c_proj.weight, W_proj, "W_proj_r")
        mlp.c_fc, mlp.c_proj = c_fc, c_proj


def train_with_shards(job: ShardJob) -> ShardTraining:
    """settings.steps AdamW steps of the GPT with the learner's MLP shards, every rank on the whole batch."""
    S, r, tp = job.settings, rank(), world_size()
    model = build_gpt(S)
    error = ""
    try:
        split_mlps(model, load_function(job.source, job.name, {"torch": torch}), tp, r)
    except LEARNER_ERRORS as e:
        error = f"rank {r}: {where_it_failed(e, f'<your {job.name}>', job.source)}"
    errors = [None] * tp
    dist.all_gather_object(errors, error)  # all ranks stop alike: none waits in an all-reduce
    if any(errors):
        return ShardTraining(losses=[], error=next(e for e in errors if e))
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(S.seed + 1)
    losses = []
    for step in range(S.steps):
        X, Y = global_batch(S, g, S.batch_size)
        _, loss = model(X, Y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        report_progress(step + 1, S.steps, "your MLP shards")
    return ShardTraining(losses=losses)
