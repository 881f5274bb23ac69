"""Lesson 02 — learning-rate schedules: warm-up, cosine, linear, WSD, on the same budget.

The settings of notebooks/02_lr_schedules.ipynb and the one training helper its sections share:

    designer.py      the schedules drawn, with a panel
    equal_budget.py  constant, cosine, linear and WSD on the same number of steps
    warmup.py        why warm up: the first steps of Adam, with and without
    wsd.py           WSD: extending a run without starting over
"""

from dataclasses import dataclass

import torch

from labtools import data
from labtools.config import LabConfig, build_gpt, resolve
from labtools.device import pick_device
from labtools.model import GPT
from labtools.optim import param_groups
from labtools.train import History, TrainConfig, train


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    budget: int             # steps of the equal-budget comparison
    peak_lr: float          # its peak learning rate
    warmup_lr: float        # the high peak lr of the warmup ablation
    warmup_steps: int       # length of the warmup ablation runs
    horizon: int            # the WSD experiment's long horizon; the short one is half of it
    decay_margin: float | None  # what this profile's runs can show: decaying beats constant by at least this;
                                # None: runs too short to say (the sign changes with the seed)
    warmup_margin: float | None  # ... and warmup beats none by at least this (nats); None: runs too short to say
    estimates: int = 5      # validation estimates along each run after the one at its start (they draw the curves)
    seeds: int = 1          # seeds the decay-against-constant comparison is made over (1: this run only, no interval)
    agree_within: float = 0.05  # nats: how close schedules that should end alike must end (the smoke profile's
                                # short runs scatter more: 0.053 at worst over seeds 0-7)

    RANGES = {"BUDGET": (50, 1_000_000), "PEAK_LR": (1e-6, 1.0), "WARMUP_LR": (1e-6, 1.0), "SEEDS": (1, 100),
              "WARMUP_STEPS": (50, 1_000_000), "HORIZON": (50, 1_000_000), "ESTIMATES": (1, 1000)}


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, block_size=64, batch_size=16, budget=180, peak_lr=1e-2,
                      warmup_lr=3e-2, warmup_steps=120, horizon=180, decay_margin=None, warmup_margin=None,
                      estimates=3, agree_within=0.075),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, budget=600, peak_lr=1e-2,
                    warmup_lr=3e-2, warmup_steps=400, horizon=600, decay_margin=0.05, warmup_margin=None, seeds=4),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, budget=3000, peak_lr=3e-3,
                    warmup_lr=1e-2, warmup_steps=2000, horizon=4000, decay_margin=0.02, warmup_margin=0.05),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus() -> data.Corpus:
    return data.text()


BETAS = (0.9, 0.95)  # every run of this lesson


def build(S: Settings, lr: float) -> tuple[GPT, torch.optim.Optimizer]:
    model = build_gpt(S, device=pick_device())
    return model, torch.optim.AdamW(param_groups(model, 0.1), lr=lr, betas=BETAS)


def train_run(S: Settings, schedule, steps: int, lr: float, *, desc: str, start_step: int = 0, model=None,
              optimizer=None, callback=None, grad_clip: float | None = 1.0, **run_kw) -> History:
    """A run of this lesson's model on its corpus; run_kw go to TrainConfig (checkpoint_dir, checkpoint_every,
    stop_at: a run saved part-way and continued)."""
    if model is None:
        model, optimizer = build(S, lr)
    # Every claim reads final validation losses (20 batches, the same each time); S.estimates along a run draw the
    # curves (evaluation draws no training batches, so their number leaves every final loss unchanged); more would
    # cost as much as a third of the run.
    cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=lr, lr_schedule=schedule,
                      eval_every=max(1, steps // S.estimates), eval_batches=20, seed=S.seed, start_step=start_step,
                      grad_clip=grad_clip, desc=desc, **run_kw)
    return train(model, corpus(), cfg, optimizer=optimizer, callback=callback)
