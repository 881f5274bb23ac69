"""Lesson 00 — the training loop: one step taken apart, then real training to a known floor.

The settings of notebooks/00_training_loop.ipynb and the model and training config its sections share:

    one_step.py    forward, loss, backward, step: timed, and the loss at initialisation
    training.py    training on a corpus of known entropy, then on real text
    playground.py  the panel: model size against the loss it reaches
"""

from dataclasses import dataclass

import torch

from labtools.config import LabConfig, gpt_config, resolve
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    text_steps: int       # optimizer steps on the real-text corpus
    timing_repeats: int   # repeats of the one-step phase timing
    floor_gap_max: float  # the claim this profile can support: val loss - entropy rate <= this

    RANGES = {"STEPS": (10, 100_000), "TEXT_STEPS": (10, 100_000), "BATCH_SIZE": (1, 1024), "BLOCK_SIZE": (8, 1024),
              "N_LAYER": (1, 24), "N_EMBD": (16, 2048), "LR": (1e-6, 1.0)}

    def __post_init__(self):
        super().__post_init__()
        if self.n_embd % self.n_head:
            raise ValueError(f"N_EMBD must be a multiple of n_head={self.n_head}, got {self.n_embd}")


PROFILES = {
    "smoke": Settings(profile="smoke", steps=500, text_steps=150, batch_size=16, block_size=64, n_layer=2, n_embd=64,
                      n_head=4, lr=1e-2, timing_repeats=5, floor_gap_max=0.3),
    "cpu": Settings(profile="cpu", steps=800, text_steps=600, batch_size=16, block_size=128, n_layer=4, n_embd=128,
                    n_head=4, lr=3e-3, timing_repeats=10, floor_gap_max=0.15),
    "gpu": Settings(profile="gpu", steps=2000, text_steps=3000, batch_size=64, block_size=256, n_layer=6, n_embd=384,
                    n_head=6, lr=1e-3, timing_repeats=20, floor_gap_max=0.05),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def model_config(S: Settings, vocab_size: int, **changes) -> GPTConfig:
    return gpt_config(S, vocab_size, **changes)


def build_model(S: Settings, vocab_size: int, **changes) -> GPT:
    torch.manual_seed(S.seed)
    return GPT(model_config(S, vocab_size, **changes)).to(pick_device())


def train_config(S: Settings, steps: int, desc: str) -> TrainConfig:
    schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    return TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=S.lr, lr_schedule=schedule,
                       eval_every=max(1, steps // 10), seed=S.seed, desc=desc)  # the claims read the final one
