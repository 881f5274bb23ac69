"""Lesson 04 — mixed precision: number formats, overflow, underflow, loss scaling, fp32 master weights, speed.

The settings of notebooks/04_mixed_precision.ipynb, its corpus and model. One module per section:

    formats.py         fp32, fp16, bf16 (and fp8): bits, range, precision
    overflow.py        the residual stream past fp16's 65504, in storage and under autocast
    underflow.py       real gradients against fp16's smallest numbers
    loss_scaling.py    static and dynamic loss scaling in a real run
    master_weights.py  why the weights stay fp32
    speed.py           what reduced precision buys on this machine
"""

from dataclasses import dataclass

from labtools import data
from labtools.config import LabConfig, build_gpt, resolve
from labtools.device import pick_device
from labtools.model import GPT


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    scaling_steps: int     # length of each loss-scaling run
    shrink_exp: int        # gradients are multiplied by 2^-shrink_exp (a large model's gradient scale)
    growth_interval: int   # the dynamic scaler's (GradScaler's default is 2000; short here to see cycles)
    master_steps: int      # length of the fp32-master vs pure-bf16 runs
    master_lr: float
    speed_steps: int       # timed training steps per precision
    matmul_size: int = 1024  # n of the timed n×n matrix products
    eval_batches: int = 10   # validation batches per estimate in the training runs (the same ones every time)
    seeds: int = 1           # seeds the fp32 master and pure bf16 weights are compared over (1: this run only)

    RANGES = {"SCALING_STEPS": (20, 1_000_000), "SHRINK_EXP": (0, 60), "GROWTH_INTERVAL": (1, 100_000),
              "MASTER_STEPS": (40, 1_000_000), "MASTER_LR": (1e-6, 1.0), "SPEED_STEPS": (1, 1000),
              "MATMUL_SIZE": (16, 16384), "EVAL_BATCHES": (1, 1000), "SEEDS": (1, 100)}


PROFILES = {
    # smoke keeps the reduced-precision runs small: a CPU without bf16/fp16 units emulates those products; its
    # claims compare runs on the same validation batches, and at 4 batches they kept their margins at seeds 0-2
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, block_size=32, batch_size=16, scaling_steps=30,
                      shrink_exp=16,
                      growth_interval=2, master_steps=40, master_lr=1e-3, speed_steps=3, matmul_size=512,
                      eval_batches=4),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, scaling_steps=300, shrink_exp=16,
                    growth_interval=10, master_steps=400, master_lr=1e-3, speed_steps=10, seeds=3),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, scaling_steps=1000,
                    shrink_exp=16,
                    growth_interval=50, master_steps=2000, master_lr=1e-3, speed_steps=20),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus() -> data.Corpus:
    return data.text()


def build(S: Settings) -> GPT:
    return build_gpt(S, device=pick_device())
