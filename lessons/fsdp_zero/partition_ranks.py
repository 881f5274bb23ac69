"""Lesson 08, train with yours: ZeRO-1 written out on real ranks with the learner's partition (sent as source).
DDP averages the gradients; each rank keeps AdamW's state for, and updates, only the parameters its part of the
partition names; then every parameter is broadcast from the rank that updated it. The same model, batches and
optimizer as section 3's DDP run (ranks.equivalence).

    $ python -m labtools.parallel make-job lessons.fsdp_zero.partition_ranks:train_with_partition '{...}' --run-dir R
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker R/job.json
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.learner import BOUND_FLOOR_S, LEARNER_ERRORS, load_function, time_bound, where_it_failed
from labtools.memory import tensor_bytes
from labtools.optim import AdamW
from labtools.parallel.toolkit import build_gpt, global_batch, rank, rank_rows, report_progress, train_step, world_size
from lessons.fsdp_zero import Settings


@dataclass(frozen=True)
class PartitionJob:
    """The learner's function, sent as source, and the lesson's settings."""
    settings: Settings
    source: str
    name: str = "my_zero1_partition"


@dataclass(frozen=True)
class PartitionTraining:
    """The global loss per step, and the bytes of the optimizer state this rank kept; or the error a rank met."""
    losses: list[float]
    optimizer_bytes: int = 0
    error: str = ""


def owners(job: PartitionJob, sizes: list[int], n: int) -> list[int]:
    """For each parameter, the rank that keeps its optimizer state, from the learner's partition."""
    fn = load_function(job.source, job.name, {})
    with time_bound(BOUND_FLOOR_S):
        parts = [[int(i) for i in part] for part in fn(list(sizes), n)]
    owner = [-1] * len(sizes)
    for r, part in enumerate(parts):
        for i in part:
            owner[i] = r
    if len(parts) != n or -1 in owner or sum(map(len, parts)) != len(sizes):
        raise ValueError("your partition must name every parameter exactly once, over the ranks")
    return owner


def train_with_partition(job: PartitionJob) -> PartitionTraining:
    """settings.steps steps of ZeRO-1 with the learner's partition; the losses as ranks.equivalence reports them."""
    S, r, n = job.settings, rank(), world_size()
    model = build_gpt(S)
    params = list(model.parameters())
    error = ""
    try:
        owner = owners(job, [p.numel() for p in params], n)
    except LEARNER_ERRORS as e:
        owner, error = [], f"rank {r}: {where_it_failed(e, f'<your {job.name}>', job.source)}"
    errors = [None] * n
    dist.all_gather_object(errors, error)  # all ranks stop alike
    if any(errors):
        return PartitionTraining(losses=[], error=next(e for e in errors if e))
    module = DDP(model)
    opt = AdamW([p for p, o in zip(params, owner) if o == r], lr=S.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(S.seed + 1)
    losses = []
    for step in range(S.steps):
        X, Y = global_batch(S, g, n * S.batch_size)
        losses.append(train_step(module, opt, [(rank_rows(X), rank_rows(Y))]))  # steps this rank's part only
        model.zero_grad(set_to_none=True)  # the other ranks' parts too: DDP's next average must start from zero
        with torch.no_grad():
            for p, o in zip(params, owner):
                dist.broadcast(p, src=o)  # the updated part, from the rank that owns it, to every rank
        report_progress(step + 1, S.steps, "ZeRO-1 with your partition")
    state = tensor_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return PartitionTraining(losses=losses, optimizer_bytes=state)
