"""Lesson 14 — context parallelism: the sequence split over ranks, ring attention on real ranks, balanced for the
causal mask.

The settings of notebooks/14_context_parallel.ipynb. One module per section:

    merge_exercise.py  your turn: merge two partial attentions with their log-sum-exps
    ring.py            ring attention on c ranks against one process; bytes, work and time per rank; memory
    ranks.py           what runs inside the torchrun ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    heads: int          # attention heads a of the one sequence attended
    head_dim: int       # numbers per head
    seq: int            # sequence length s, split over the ranks
    worlds: tuple       # context-parallel sizes c launched
    rounds: int         # timed forward-and-backward rounds per layout

    RANGES = {"SEQ": (64, 1 << 16), "ROUNDS": (1, 100)}

    def __post_init__(self):
        super().__post_init__()
        for c in self.worlds:
            if self.seq % (2 * c):
                raise ValueError(f"SEQ ({self.seq}) must split into 2c = {2 * c} equal blocks for c = {c}")


PROFILES = {
    "smoke": Settings(profile="smoke", heads=4, head_dim=16, seq=512, worlds=(2, 4), rounds=5),
    "cpu": Settings(profile="cpu", heads=4, head_dim=32, seq=2048, worlds=(2, 4), rounds=5),
    "gpu": Settings(profile="gpu", heads=8, head_dim=64, seq=8192, worlds=(2, 4), rounds=5),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
