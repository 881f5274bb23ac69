"""Lesson 18's training runs: a tiny GPT on a synthetic Markov source (lesson 00's), one run per seed and recipe.
A seed sets the initial weights (torch.manual_seed before the model is built) and, separately, the order of the
batches (the training loop's generator); the validation batches are the same for every run. Each run is kept
(functools.lru_cache), so a section that needs a run another made reads it."""

import functools
from dataclasses import dataclass

import torch

from labtools import data
from labtools.config import gpt_config
from labtools.model import GPT
from labtools.progress import progress
from labtools.train import TrainConfig, train
from lessons.evidence import Settings

VAL_BATCHES = 8


@dataclass(frozen=True)
class Recipe:
    """What is compared: everything else, model and data included, is the same."""
    name: str
    lr: float
    weight_decay: float


def recipes(S: Settings) -> dict[str, Recipe]:
    return {"A": Recipe("A", S.lr, S.weight_decay), "B": Recipe("B", S.lr_b, S.weight_decay),
            "C": Recipe("C", S.lr, S.wd_c)}


def corpus() -> data.Corpus:
    """Lesson 00's kind of source, smaller: 16 tokens, each context of two followed by one of four."""
    return data.synthetic(vocab_size=16, order=2, branching=4, n_tokens=2**17, row_len=256, seed=0)


@functools.lru_cache(maxsize=1024)
def final_loss(S: Settings, recipe: Recipe, init_seed: int, data_seed: int) -> float:
    """The validation loss after S.steps steps, the weights initialised from init_seed, batches drawn by data_seed."""
    torch.manual_seed(init_seed)
    model = GPT(gpt_config(S, corpus().vocab_size))
    cfg = TrainConfig(steps=S.steps, batch_size=S.batch_size, block_size=S.block_size, lr=recipe.lr,
                      weight_decay=recipe.weight_decay, seed=data_seed, eval_every=S.steps,
                      eval_batches=VAL_BATCHES, progress=False)
    return train(model, corpus(), cfg).final_val_loss


def over_seeds(S: Settings, recipe: Recipe, *, init: int | None = None, data_seed: int | None = None,
               desc: str = "") -> list[float]:
    """The recipe's final loss for seeds 0 … S.seeds − 1: each seed sets what init / data_seed leave free."""
    return [final_loss(S, recipe, s if init is None else init, s if data_seed is None else data_seed)
            for s in progress(range(S.seeds), desc=desc or f"recipe {recipe.name}")]
