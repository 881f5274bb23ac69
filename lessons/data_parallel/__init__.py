"""Lesson 07 — data parallelism: naive all-reduce, DDP, no_sync, buckets and the ring, on real ranks.

The settings of notebooks/07_data_parallel.ipynb. One module per section of the notebook:

    equivalence.py   DDP on N ranks ≡ one process on the N-times batch; the ring all-reduce; bytes on the wire
    accumulation.py  no_sync() and gradient accumulation; DDP's buckets
    playground.py    the panel: a DDP run of your choice
    ranks.py         what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    accum_k: int = 4       # micro-batches per step in the accumulation experiment
    world_sizes: tuple = (2, 4)  # ranks for the equivalence launches
    bucket_cap_mb: float = 25.0                              # DDP's bucket size in the panel's run
    bucket_caps_mb: tuple[float, ...] = (0.01, 0.05, 25.0)   # bucket sizes the bucket experiment compares
    exercise_worlds: tuple = (3,)                            # ranks your ring all-reduce is checked on

    RANGES = {"STEPS": (1, 10_000), "BATCH_SIZE": (1, 1024), "ACCUM_K": (2, 64)}

    def __post_init__(self):
        super().__post_init__()
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError(f"WORLD_SIZES must be positive ints, got {self.world_sizes!r}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=15, accum_k=4,
                      world_sizes=(2, 4)),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=60, accum_k=4,
                    world_sizes=(2, 4), exercise_worlds=(2, 3, 4)),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=16, steps=200, accum_k=4,
                    world_sizes=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# No overall time limit on a lesson's launch: a valid STEPS may run long (it shows progress), while a hang
# still ends at the process-group timeout.
TIMEOUT_S = None
