"""Lesson 06 — the memory budget: parameters, gradients, optimizer states and activations, from 124M to 405B.

The settings of notebooks/06_memory_budget.ipynb. One module per section:

    calculator.py     the budget of any model and layout, with a panel
    tables.py         published tables reproduced (7B, 70B, ZeRO, conventions)
    source_claims.py  statements from outside the lab, settled
    validation.py     the estimate against real small models
    zero_exercise.py  your turn: bytes per parameter under a ZeRO stage
"""

from dataclasses import dataclass

from labtools import plan
from labtools.config import LabConfig, resolve
from labtools.layout import Layout
from labtools.shapes import MODELS

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    validation_shapes: tuple  # (n_layer, n_embd, n_head, vocab, T, B) of the small models measured

    def __post_init__(self):
        super().__post_init__()
        if not self.validation_shapes:
            raise ValueError("need at least one validation shape")


PROFILES = {
    "smoke": Settings(profile="smoke", validation_shapes=((2, 64, 4, 96, 32, 4), (4, 32, 2, 96, 64, 2),
                                                  (3, 128, 8, 96, 16, 8))),
    "cpu": Settings(profile="cpu", validation_shapes=((2, 64, 4, 96, 64, 8), (4, 128, 4, 96, 128, 8),
                                                      (8, 128, 8, 96, 256, 4),
                                              (6, 256, 8, 96, 128, 4))),
    "gpu": Settings(profile="gpu", validation_shapes=((4, 256, 8, 96, 256, 8), (12, 768, 12, 50257, 1024, 4),
                                              (24, 1024, 16, 50257, 1024, 2))),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def budget(preset: str, *, dp=1, tp=1, pp=1, offload=None, **kw):
    """The budget per GPU of a published model (labtools.plan.MODELS) under a layout: labtools.plan.memory_per_gpu."""
    return plan.memory_per_gpu(MODELS[preset], Layout(dp, tp, pp), offload=offload, **kw)
