"""Lesson 19's training runs: the lab's GPT on the standard library's source (characters), by width, optimizer,
parametrization, learning rate, steps and seed. Heads stay head_dim wide, so a wider model has more heads; the head
(the readout) is untied from the embedding and starts at zero, so that at the base width the standard
parametrization (SP) and µP are the same model. The learning rate holds, then falls to zero over the last 30% of the
steps (a final loss read after the decay scatters less). Each run is kept, so a section that needs a run another
made reads it."""

import dataclasses
import time
from dataclasses import dataclass

import torch

from labtools import data
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.optim import Muon, mup_groups, muon_groups, param_groups
from labtools.progress import progress
from labtools.schedules import bind, wsd
from labtools.train import TrainConfig, train
from lessons.muon_mup import Settings

DECAY = 0.3          # the last 30% of the steps take the learning rate to zero
VAL_BATCHES = 8
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.0   # none: the comparisons are of the update rules and the scalings alone


@dataclass(frozen=True)
class Recipe:
    """One training run: everything else (data, batch, depth, schedule) is the lesson's."""
    width: int
    steps: int
    lr: float                 # AdamW's; with Muon, the matrices' (adam_lr steps the rest)
    optimizer: str = "adamw"  # "adamw" | "muon"
    mup: bool = False         # µP's three scalings by width (base width: the lesson's narrowest)
    seed: int = 0
    adam_lr: float = 0.0      # Muon runs: AdamW's learning rate for embeddings, head, biases and norms


@dataclass(frozen=True)
class Run:
    recipe: Recipe
    final: float              # validation loss at the end, nats
    losses: tuple             # training loss of every step
    seconds: float


def corpus() -> data.Corpus:
    return data.text()


def model(S: Settings, width: int, mup: bool, seed: int) -> GPT:
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=corpus().vocab_size, block_size=S.block_size, n_layer=S.n_layer,
                      n_head=width // S.head_dim, n_embd=width, tie_embeddings=False,
                      mup_base_width=S.base_width if mup else None))
    torch.nn.init.zeros_(m.lm_head.weight)  # µP's readout starts at zero; SP's here too, so they meet at the base
    return m.to(pick_device())


def optimizer(m: GPT, r: Recipe, orthogonalize=None) -> torch.optim.Optimizer:
    if r.optimizer == "muon":
        kw = {} if orthogonalize is None else {"orthogonalize": orthogonalize}
        return Muon(muon_groups(m, r.lr, r.adam_lr, WEIGHT_DECAY), betas=BETAS, **kw)
    groups = mup_groups(m, r.lr, WEIGHT_DECAY) if r.mup else param_groups(m, WEIGHT_DECAY)
    return torch.optim.AdamW(groups, lr=r.lr, betas=BETAS)


def schedule(steps: int):
    decay = max(1, round(steps * DECAY))
    return bind(wsd, warmup=0, stable=steps - decay, decay=decay)


_KEPT: dict[tuple[Settings, Recipe], Run] = {}


def train_run(S: Settings, r: Recipe, orthogonalize=None, desc: str | None = None) -> Run:
    """The run r describes, kept for any section that asks again (orthogonalize: a Muon run with the learner's
    Newton–Schulz, not kept). desc: a progress bar over its steps, so labelled."""
    if orthogonalize is not None:
        return _train(S, r, orthogonalize, desc)
    same = dataclasses.replace(r, mup=False) if r.mup and r.width == S.base_width else r  # µP at its base width is
    if (S, same) not in _KEPT:                                                               # SP: the same run
        _KEPT[S, same] = _train(S, same, None, desc)
    return dataclasses.replace(_KEPT[S, same], recipe=r)


def train_all(S: Settings, recipes, desc: str) -> list[Run]:
    """Each recipe's run, in order, with a progress bar over the runs (a kept run counts at once)."""
    return [train_run(S, r) for r in progress(list(recipes), desc=desc)]


def _train(S: Settings, r: Recipe, orthogonalize, desc: str | None) -> Run:
    m = model(S, r.width, r.mup, r.seed)
    cfg = TrainConfig(steps=r.steps, batch_size=S.batch_size, block_size=S.block_size, lr=r.lr,
                      lr_schedule=schedule(r.steps), seed=r.seed, eval_every=r.steps, eval_batches=VAL_BATCHES,
                      progress=desc is not None, desc=desc or "train")
    start = time.perf_counter()
    h = train(m, corpus(), cfg, optimizer=optimizer(m, r, orthogonalize))
    return Run(r, h.final_val_loss, tuple(h.loss), time.perf_counter() - start)


def non_embedding_params(S: Settings, width: int) -> int:
    """Parameters in the blocks (attention and MLP matrices, biases, norms), counted on the model."""
    m = model(S, width, False, 0)
    return sum(p.numel() for n, p in m.named_parameters() if n.startswith("transformer.h."))


def params(S: Settings, width: int) -> int:
    """Every parameter the model trains, embeddings and head included (counted on the model)."""
    return model(S, width, False, 0).num_params()


def flops(S: Settings, width: int, steps: int) -> float:
    """Training FLOPs of a run: 6 per parameter per token (the forward's 2, the backward's 4), every parameter."""
    return 6.0 * params(S, width) * steps * S.batch_size * S.block_size
