"""Lesson 12 — the compute budget: FLOPs per token, MFU, an isoFLOP sweep, and the days a run takes.

The settings of notebooks/12_compute_budget.ipynb. One module per section:

    flops.py          FLOPs per token: three conventions against the counter
    utilisation.py    this machine's peak, and the MFU and HFU of a training step
    isoflop.py        an isoFLOP sweep: the best model size at each budget
    training_time.py  published runs reproduced, a days-and-cost calculator, weak scaling
    ranks.py          what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, build_gpt, resolve
from labtools.data import text
from labtools.device import pick_device
from labtools.model import GPT

TIMEOUT_S = 300


CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: ≈ 20 tokens per parameter at the compute optimum


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    shapes: tuple          # (n_layer, n_embd, n_head, seq) of the models whose FLOPs are counted
    time_rounds: int       # alternating rounds of plain and checkpointed steps
    time_steps: int        # steps per round
    matmul_sizes: tuple    # n of the n×n matrix products that measure the peak
    budgets: tuple         # isoFLOP budgets, FLOPs per run
    widths: tuple          # n_embd of the sweep's models (n_layer = sweep_layers, heads of 16, at least one)
    sweep_layers: int
    sweep_batch: int
    sweep_block: int
    sweep_lr: float
    scaling_steps: int     # steps per round of the weak-scaling launch
    scaling_world: int

    RANGES = {"TIME_ROUNDS": (1, 100), "TIME_STEPS": (1, 1000), "SWEEP_LR": (1e-5, 1.0), "SCALING_STEPS": (1, 1000),
              "SCALING_WORLD": (2, 8)}

    def __post_init__(self):
        super().__post_init__()
        if len(self.budgets) < 2 or min(self.budgets) <= 0 or list(self.budgets) != sorted(set(self.budgets)):
            raise ValueError(f"BUDGETS must be at least two increasing FLOP counts > 0, got {self.budgets!r}")
        if len(self.widths) < 3 or any(not isinstance(w, int) or w % 8 or w < 8 for w in self.widths):
            raise ValueError(f"WIDTHS must be at least three multiples of 8, got {self.widths!r}")
        for L, d, h, T in self.shapes:
            if d % h:
                raise ValueError(f"shape {(L, d, h, T)}: n_embd must be a multiple of n_head")


PROFILES = {
    "smoke": Settings(profile="smoke", shapes=((2, 64, 4, 64), (4, 128, 4, 128), (3, 96, 6, 256)), n_layer=2, n_embd=64,
                      n_head=4, block_size=64, batch_size=16, time_rounds=3, time_steps=4, matmul_sizes=(256, 512),
                      budgets=(3e9, 1e10), widths=(8, 16, 32, 64), sweep_layers=2, sweep_batch=16, sweep_block=32,
                      sweep_lr=1e-2, scaling_steps=4, scaling_world=2),
    "cpu": Settings(profile="cpu", shapes=((2, 64, 4, 64), (4, 128, 4, 128), (6, 192, 6, 256)), n_layer=4, n_embd=128,
                    n_head=4, block_size=128, batch_size=16, time_rounds=5, time_steps=5,
                    matmul_sizes=(256, 512, 1024), budgets=(3e9, 1e10, 3e10, 1e11), widths=(8, 16, 32, 64),
                    sweep_layers=2, sweep_batch=16, sweep_block=32, sweep_lr=1e-2, scaling_steps=8, scaling_world=2),
    "gpu": Settings(profile="gpu", shapes=((2, 64, 4, 64), (12, 768, 12, 1024), (24, 1024, 16, 1024)), n_layer=12,
                    n_embd=768, n_head=12, block_size=1024, batch_size=8, time_rounds=5, time_steps=10,
                    matmul_sizes=(1024, 4096, 8192), budgets=(1e13, 3e13, 1e14), widths=(64, 128, 192, 256, 384),
                    sweep_layers=4, sweep_batch=32, sweep_block=256, sweep_lr=3e-3, scaling_steps=10,
                    scaling_world=2),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus():
    return text()


def gpt(n_layer: int, n_embd: int, n_head: int, seq: int, seed: int = 0, **kw) -> GPT:
    shape = LabConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=seq, seed=seed)
    return build_gpt(shape, corpus().vocab_size, device=pick_device(), **kw)
