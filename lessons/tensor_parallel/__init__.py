"""Lesson 10 — tensor and sequence parallelism: Megatron's split on real ranks, what it sends and saves.

The settings of notebooks/10_tensor_parallel.ipynb and the launch its sections share:

    parity.py         the split layers and the whole model against one process
    communication.py  collectives per layer and bytes on the wire
    memory.py         activations per rank with and without sequence parallelism
    two_d.py          data × tensor parallel training
    interconnect.py   why tensor parallelism stays inside a node, and an exercise on paper
    ranks.py          what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.plan import CLUSTERS, GPU

GB = 1e9


A100, H100 = CLUSTERS[GPU.A100], CLUSTERS[GPU.H100]


CURVE_WINDOW = 10  # steps held equal: this small, unclipped run amplifies last-bit differences within ~20 steps


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    n_head: int = 8          # divisible by every tensor-parallel size used
    batch_size: int = 4      # rows each tensor-parallel group sees (the whole batch for pure TP)
    steps: int = 5
    worlds: tuple = (2, 4)   # tensor-parallel sizes launched
    dp: int = 1              # data-parallel size of the 2-D run (tp = world / dp)

    RANGES = {"BATCH_SIZE": (2, 256), "STEPS": (1, 10_000)}

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size % 2:
            raise ValueError(f"BATCH_SIZE must be even (dp = 2 splits it), got {self.batch_size}")
        for t in self.worlds:
            if self.n_head % t or self.n_embd % t:
                raise ValueError(f"tp = {t} must divide n_head ({self.n_head}) and n_embd ({self.n_embd})")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, n_head=8, block_size=64, batch_size=4,
                      steps=5, worlds=(2, 4)),
    "cpu": Settings(profile="cpu", n_layer=4, n_embd=128, n_head=8, block_size=64, batch_size=8,
                    steps=40, worlds=(2, 4)),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, n_head=8, block_size=256, batch_size=16,
                    steps=100, worlds=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
