"""Lesson 01 — AdamW against Adam with L2: decoupled weight decay, measured.

The settings of notebooks/01_adamw_vs_adam_l2.ipynb, its corpus and model. One module per section:

    parity.py     our from-scratch optimizers against torch.optim
    toy.py        the mechanism on a toy: L2 through Adam's normaliser vs decay applied directly
    groups.py     on the tiny GPT, per parameter group
    landscape.py  final loss over learning rate × weight decay
    memory.py     optimizer state bytes per parameter
    beta2.py      β2 = 0.999 against 0.95 when gradients change scale
"""

from dataclasses import dataclass

from labtools import data
from labtools.config import LabConfig, build_gpt, resolve
from labtools.device import pick_device
from labtools.model import GPT
from labtools.optim import AdamL2, AdamW

OPTIMIZERS = {"AdamL2": AdamL2, "AdamW": AdamW}


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    toy_n: int                # weights per noise level in the toy
    toy_steps: int
    text_chars: int           # size of the stdlib-text corpus (small, so the model can overfit it)
    compare_steps: int        # AdamL2 vs AdamW at the same lr and λ
    compare_lr: float
    weight_decay: float       # the λ of that comparison
    grid_lrs: tuple           # the landscape's learning rates ...
    grid_wds: tuple           # ... and weight decays
    grid_steps: int
    beta2_steps: int          # β2 = 0.999 vs 0.95
    beta2_lr: float
    surge_factor: float       # gradient scale multiplied by this from half-way through the surge run

    RANGES = {"TOY_STEPS": (50, 100_000), "COMPARE_STEPS": (20, 100_000), "GRID_STEPS": (20, 100_000),
              "BETA2_STEPS": (40, 100_000), "WEIGHT_DECAY": (0.0, 10.0), "COMPARE_LR": (1e-6, 1.0),
              "BETA2_LR": (1e-6, 1.0), "SURGE_FACTOR": (1.0, 1e4)}

    def __post_init__(self):
        super().__post_init__()
        if len(self.grid_lrs) < 2 or len(self.grid_wds) < 2:
            raise ValueError("the landscape needs at least 2 learning rates and 2 weight decays")


PROFILES = {
    "smoke": Settings(profile="smoke", toy_n=4000, toy_steps=400, n_layer=2, n_embd=64, block_size=64, batch_size=16,
                      text_chars=100_000, compare_steps=60, compare_lr=3e-3, weight_decay=0.1,
                      grid_lrs=(3e-3, 1e-2), grid_wds=(1e-3, 1.0), grid_steps=40,
                      beta2_steps=200, beta2_lr=1e-2, surge_factor=10.0),
    "cpu": Settings(profile="cpu", toy_n=20_000, toy_steps=1000, n_layer=2, n_embd=64, block_size=64, batch_size=16,
                    text_chars=100_000, compare_steps=600, compare_lr=3e-3, weight_decay=0.1,
                    grid_lrs=(1e-3, 3e-3, 1e-2, 3e-2), grid_wds=(1e-3, 1e-2, 1e-1, 1.0), grid_steps=400,
                    beta2_steps=400, beta2_lr=1e-2, surge_factor=10.0),
    "gpu": Settings(profile="gpu", toy_n=100_000, toy_steps=3000, n_layer=4, n_embd=128, block_size=128, batch_size=32,
                    text_chars=300_000, compare_steps=2000, compare_lr=3e-3, weight_decay=0.1,
                    grid_lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1), grid_wds=(1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0),
                    grid_steps=1500, beta2_steps=1500, beta2_lr=1e-2, surge_factor=10.0),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus(S: Settings) -> data.Corpus:
    return data.text(max_chars=S.text_chars)


def build_model(S: Settings, vocab_size: int) -> GPT:
    return build_gpt(S, vocab_size, device=pick_device())
