"""Lesson 08 — FSDP and ZeRO: sharding parameters, gradients and optimizer states across ranks.

The settings of notebooks/08_fsdp_zero.ipynb. One module per section:

    sharding.py     what each rank holds under each strategy, measured and predicted
    picture.py      the picture of it: ranks × parameters, gradients, optimizer state
    fsdp1.py        the same with FSDP1's sharding strategies
    traffic.py      what sharding sends
    equivalence.py  FSDP trains like DDP
    ranks.py        what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.budget import estimate
from labtools.config import LabConfig, resolve
from labtools.keys import Key


class Strategy(Key):
    """How the model states are split over the ranks: one name for the ranks, the figures and the claims (the value
    is the key results are stored under; `label` is what a reader sees)."""
    DDP = "ddp"                # every rank holds everything
    ZERO1 = "zero1"            # DDP + ZeroRedundancyOptimizer: optimizer state sharded
    ZERO2 = "zero2"            # fully_shard without resharding after forward
    ZERO3 = "zero3"            # fully_shard
    ZERO3_BF16 = "zero3_bf16"  # fully_shard with bf16 parameters (gradients reduced in fp32)

    @property
    def zero_stage(self) -> int:
        return {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "zero3_bf16": 3}[self.value]

    @property
    def label(self) -> str:
        return {"ddp": "DDP (no sharding)", "zero1": "ZeRO-1: optimizer state sharded",
                "zero2": "ZeRO-2: no reshard after forward", "zero3": "ZeRO-3: everything sharded",
                "zero3_bf16": "ZeRO-3, bf16 parameters"}[self.value]

    @property
    def short(self) -> str:
        return {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "zero3_bf16": "ZeRO-3 bf16"}[
            self.value]


STRATEGIES = tuple(Strategy)


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    world_sizes: tuple = (2, 4)  # ranks for the sharding measurements

    RANGES = {"STEPS": (1, 10_000), "BATCH_SIZE": (1, 1024)}

    def __post_init__(self):
        super().__post_init__()
        if not self.world_sizes or min(self.world_sizes) < 2:
            raise ValueError(f"WORLD_SIZES must be ints >= 2 (sharding needs ranks), got {self.world_sizes!r}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=10, world_sizes=(2, 4)),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=40, world_sizes=(2, 4)),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=16, steps=200, world_sizes=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


TIMEOUT_S = None  # a valid STEPS may run long; hangs end at the process-group timeout


@dataclass(frozen=True)
class StateBytes:
    """Bytes of the model states on one rank."""
    params: int
    grads: int
    optimizer: int  # the optimizer's state


def predicted(n_params: int, strategy: Strategy, world: int) -> StateBytes:
    """labtools.budget.estimate for the same model: fp32 weights and gradients, AdamW, the strategy's ZeRO stage."""
    b = estimate(n_params, precision="fp32", optimizer="adamw", zero_stage=Strategy(strategy).zero_stage, dp=world)
    return StateBytes(params=b.parts.get("weights", 0), grads=b.parts.get("gradients", 0),
                      optimizer=b.parts.get("optimizer state", 0))
