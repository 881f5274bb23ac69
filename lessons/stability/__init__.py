"""Lesson 03 — stability: gradient clipping, gradient accumulation and its bug, effective batch sizes.

The settings of notebooks/03_stability.ipynb, its corpus and model. One module per section:

    clipping.py      clipping by the global norm, against bad batches
    accumulation.py  accumulation ≡ a bigger batch, the loss-normalisation bug, token normalisation
    recipes.py       effective batch and warm-up in published recipes
"""

from dataclasses import dataclass

import torch

from labtools import data
from labtools.config import LabConfig, build_gpt, resolve
from labtools.device import pick_device
from labtools.model import GPT
from labtools.optim import param_groups
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    clip_steps: int        # length of each clipping run; the bad batches arrive at the middle
    n_bad: int             # consecutive bad batches
    adamw_lr: float
    sgd_lr: float          # SGD + momentum 0.9
    accum_k: int           # micro-batches per step in the accumulation experiments
    accum_steps: int       # steps of each accumulation run

    RANGES = {"CLIP_STEPS": (40, 1_000_000), "N_BAD": (1, 100), "ADAMW_LR": (1e-6, 1.0), "SGD_LR": (1e-6, 10.0),
              "ACCUM_STEPS": (10, 1_000_000)}

    def __post_init__(self):
        super().__post_init__()
        check_range("ACCUM_K", self.accum_k, 2, self.batch_size, int)
        if self.batch_size % self.accum_k:
            raise ValueError(f"ACCUM_K must divide the batch size {self.batch_size}, got {self.accum_k}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, block_size=64, batch_size=16, clip_steps=100, n_bad=5,
                      adamw_lr=1e-2, sgd_lr=0.3, accum_k=4, accum_steps=40),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, clip_steps=400, n_bad=5,
                    adamw_lr=1e-2, sgd_lr=0.3, accum_k=4, accum_steps=300),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, clip_steps=2000, n_bad=5,
                    adamw_lr=3e-3, sgd_lr=0.1, accum_k=4, accum_steps=1500),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus() -> data.Corpus:
    return data.text()


def build(S: Settings, optimizer: str, lr: float) -> tuple[GPT, torch.optim.Optimizer]:
    model = build_gpt(S, device=pick_device())
    if optimizer == "AdamW":
        return model, torch.optim.AdamW(param_groups(model, 0.1), lr=lr, betas=(0.9, 0.95))
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
