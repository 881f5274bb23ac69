"""Lesson 14 — context parallelism: the sequence split over ranks, ring attention on real ranks, balanced for the
causal mask.

The settings of notebooks/14_context_parallel.ipynb. One module per section:

    merge_exercise.py  your turn: merge two partial attentions with their log-sum-exps
    ring.py            ring attention on c ranks against one process; bytes, work and time per rank; memory
    ranks.py           what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.device import pick_device
from labtools.memory import check_fits
from labtools.parallel.context import LAYOUTS, predicted_saved, scores_per_rank


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    heads: int          # attention heads a of the one sequence attended
    head_dim: int       # numbers per head
    seq: int            # sequence length s, split over the ranks
    worlds: tuple       # context-parallel sizes c launched
    rounds: int         # timed forward-and-backward rounds per layout

    RANGES = {"SEQ": (64, 1 << 14), "ROUNDS": (1, 100)}  # 16,384: what ring attention keeps then fits a laptop

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
    """Validated settings for a profile; None-valued overrides keep the profile's value. A SEQ whose ring attention
    would not fit this machine is refused with the numbers."""
    S = resolve(PROFILES, profile, **overrides)
    device = pick_device()
    kept = [[predicted_saved(n, S.heads) for n in scores_per_rank(S.seq, c, layout)] for c in S.worlds
            for layout in LAYOUTS]
    # every rank on this machine's CPU, or one rank per GPU
    need = max(max(k) for k in kept) if device.type == "cuda" else max(sum(k) for k in kept)
    check_fits("SEQ", S.seq, need, device, "what ring attention's ranks keep for backward, all at once")
    return S
