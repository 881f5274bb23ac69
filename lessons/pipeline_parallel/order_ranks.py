"""Lesson 09, train with yours: 1F1B training on real ranks in which each rank runs its actions in the order the
learner's my_1f1b_order gives (sent as source), over the written-out pipeline's point-to-point messages. The same
AdamW steps, model and batches as section 2's run of PyTorch's Schedule1F1B (ranks.training).

    $ python -m labtools.parallel make-job lessons.pipeline_parallel.order_ranks:train_with_order '{...}' --run-dir R
    $ torchrun --standalone --nproc-per-node 4 -m labtools.parallel.worker R/job.json
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from labtools.learner import BOUND_FLOOR_S, LEARNER_ERRORS, load_function, time_bound, where_it_failed
from labtools.parallel.pipeline import ActionTimer, gpt_stages, run_written_out
from labtools.parallel.toolkit import build_gpt, device, global_batch, rank, report_progress, world_size
from labtools.pipeline import Action
from lessons.pipeline_parallel import Settings


@dataclass(frozen=True)
class OrderJob:
    """The learner's function, sent as source, and the lesson's settings (model, batch, m, steps)."""
    settings: Settings
    source: str
    name: str = "my_1f1b_order"


@dataclass(frozen=True)
class OrderTraining:
    """The batch loss per AdamW step (every rank holds the last stage's), or the error a rank's order raised."""
    losses: list[float]
    error: str = ""


def your_order(job: OrderJob, r: int, p: int) -> list[Action]:
    """Rank r's actions from the learner's function, as the written-out pipeline's Actions on stage r."""
    fn = load_function(job.source, job.name, {})
    with time_bound(BOUND_FLOOR_S):
        return [Action(str(kind).upper(), int(mb), r) for kind, mb in fn(r, p, job.settings.m)]


def train_with_order(job: OrderJob) -> OrderTraining:
    """settings.train_steps AdamW steps, each rank running the learner's order of its actions; the losses as
    ranks.training reports them. An order that raises ends the run on every rank alike, with its line."""
    S, r, p = job.settings, rank(), world_size()
    error = ""
    try:
        order = your_order(job, r, p)
    except LEARNER_ERRORS as e:
        order, error = [], f"rank {r}: {where_it_failed(e, f'<your {job.name}>', job.source)}"
    errors = [None] * p
    dist.all_gather_object(errors, error)  # every rank stops if one cannot run: no rank waits for a message
    if any(errors):
        return OrderTraining(losses=[], error=next(e for e in errors if e))
    model = build_gpt(S, tie_embeddings=False)  # as ranks._model: the embedding and the head on different stages
    stages = gpt_stages(model, p)
    opt = torch.optim.AdamW(stages[r].parameters(), lr=S.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(S.seed + 1)
    timer = ActionTimer(r, device=device())
    losses = []
    for step in range(S.train_steps):
        X, Y = global_batch(S, g, S.batch_size)
        loss = run_written_out(order, stages, X, Y, S.m, timer, p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64)
        dist.broadcast(t, src=p - 1)  # the last stage's rank has the loss
        losses.append(t.item())
        report_progress(step + 1, S.train_steps, "1F1B with your order")
    return OrderTraining(losses=losses)
