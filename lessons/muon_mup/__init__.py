"""Lesson 19 — Muon, µP and the run you predict: an optimizer that orthogonalizes its update, hyperparameters that
carry over from a narrow model to a wide one, and a big run's loss predicted from small ones before it is made.

The settings of notebooks/19_muon_and_mup.ipynb. One module per section:

    runs.py            the lesson's training runs: the lab's GPT on the standard library's source, by width,
                       optimizer, parametrization, learning rate and seed
    orthogonalize.py   what Newton–Schulz does to a momentum matrix's singular values, and what it costs
    ns_exercise.py     your turn: Muon's Newton–Schulz iteration, checked against torch.optim.Muon
    muon_vs_adamw.py   Muon against AdamW at their best learning rates, over seeds, and the time a step takes
    mup.py             µP: the coordinate check, and the best learning rate by width under SP and under µP
    predict.py         a law fitted on small runs predicts a run with many times their compute; then it is made
"""

import dataclasses
from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    head_dim: int          # every width keeps its heads this wide: a wider model has more heads, not larger ones
    muon_lrs: tuple        # Muon's learning rates for the matrices inside the blocks (section 2)
    seeds: int             # Muon and AdamW, each at its best learning rate, over this many seeds (section 2)
    widths: tuple          # section 3's widths, narrowest first: µP equals the standard parametrization at the first
    lrs: tuple             # AdamW learning rates tried at every width (section 3; AdamW's sweep of section 2 at n_embd)
    coord_steps: int       # steps before the coordinate check reads the activations (section 3)
    ladder: tuple          # section 4's small runs: widths, narrowest first
    ladder_steps: int      # the narrowest small run's steps; each run trains for steps proportional to its width
    big_width: int         # the run section 4 predicts, trained for steps proportional to its width too
    budget: float          # the small runs may spend together at most this share of the big run's compute
    tolerance: float       # nats: a prediction within this of the big run's loss is a good one
    confidence: float = 0.95

    RANGES = {"SEEDS": (2, 100), "COORD_STEPS": (1, 10_000), "LADDER_STEPS": (1, 1_000_000), "TOLERANCE": (0.0, 10.0)}

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 1:
            raise ValueError(f"HEAD_DIM must be a positive whole number, got {self.head_dim!r}")
        check_range("BUDGET", self.budget, 0.0, 1.0, open_lo=True)
        check_range("CONFIDENCE", self.confidence, 0.0, 1.0, open_lo=True, open_hi=True)
        for name in ("WIDTHS", "LADDER"):
            widths = getattr(self, name.lower())
            if len(widths) < 2 or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in widths) \
                    or list(widths) != sorted(set(widths)):
                raise ValueError(f"{name} must be two or more increasing whole widths, got {widths!r}")
        for name in ("MUON_LRS", "LRS"):
            lrs = getattr(self, name.lower())
            if len(lrs) < 3 or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < 10
                                   for x in lrs) or list(lrs) != sorted(set(lrs)):
                raise ValueError(f"{name} must be three or more increasing learning rates in (0, 10), got {lrs!r}: "
                                 "a best value needs a neighbour on each side")
        if self.n_embd not in self.widths:
            raise ValueError(f"N_EMBD ({self.n_embd}) must be one of WIDTHS {self.widths!r}: section 2 compares at "
                             "a width section 3 sweeps")
        for name, w in [("N_EMBD", self.n_embd), ("BIG_WIDTH", self.big_width)] + \
                [("WIDTHS", w) for w in self.widths] + [("LADDER", w) for w in self.ladder]:
            if w % self.head_dim:
                raise ValueError(f"{name}: every width must be a multiple of HEAD_DIM={self.head_dim}, got {w}")
        if self.big_width <= self.ladder[-1]:
            raise ValueError(f"BIG_WIDTH ({self.big_width}) must be wider than the widest small run "
                             f"({self.ladder[-1]})")

    @property
    def base_width(self) -> int:
        return self.widths[0]

    def steps_at(self, width: int) -> int:
        """Section 4: steps for a run of this width (proportional to it, from ladder_steps at the narrowest)."""
        return max(1, round(self.ladder_steps * width / self.ladder[0]))


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=32, n_head=4, head_dim=8, block_size=32, batch_size=16,
                      steps=60, lr=2**-7, muon_lrs=(0.02, 0.04, 0.08), seeds=3, widths=(16, 32, 64),
                      lrs=(2**-9, 2**-8, 2**-7, 2**-6), coord_steps=10, ladder=(16, 24, 32), ladder_steps=100,
                      big_width=64, budget=0.3, tolerance=0.1),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, n_head=8, head_dim=8, block_size=32, batch_size=16,
                    steps=150, lr=2**-7, muon_lrs=(0.005, 0.01, 0.02, 0.04, 0.08), seeds=4, widths=(16, 32, 64, 128),
                    lrs=(2**-11, 2**-10, 2**-9, 2**-8, 2**-7, 2**-6, 2**-5), coord_steps=10,
                    ladder=(16, 24, 32, 48), ladder_steps=300, big_width=160, budget=0.1, tolerance=0.1),
    "gpu": Settings(profile="gpu", n_layer=4, n_embd=256, n_head=8, head_dim=32, block_size=128, batch_size=32,
                    steps=1000, lr=2**-8, muon_lrs=(0.005, 0.01, 0.02, 0.04, 0.08), seeds=4,
                    widths=(128, 256, 512, 1024), lrs=(2**-12, 2**-11, 2**-10, 2**-9, 2**-8, 2**-7, 2**-6),
                    coord_steps=10, ladder=(128, 192, 256, 384), ladder_steps=500, big_width=1024, budget=0.1,
                    tolerance=0.1),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value (n_head follows n_embd)."""
    S = resolve(PROFILES, profile, **overrides)
    return dataclasses.replace(S, n_head=S.n_embd // S.head_dim) if S.n_embd % S.head_dim == 0 else S
