"""Lesson 18 — is the difference real? Run-to-run noise, intervals over seeds, paired comparisons, how many seeds a
difference needs, "not different" against "the same", and exact match on a task with its interval.

The settings of notebooks/18_evidence.ipynb. One module per section:

    runs.py               the lesson's training runs: a tiny GPT on a synthetic source, one per seed and recipe
    noise.py              how much runs differ when nothing changes, and from where
    difference.py         a difference between two recipes: unpaired and paired intervals
    interval_exercise.py  your turn: the paired t-interval, checked against scipy.stats
    power.py              how many seeds a difference needs, resampled from the runs and from the formula
    same.py               "not different" is not "the same": an interval within a margin
    task.py               exact answers to held-out addition problems, with their interval
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    seeds: int             # runs per recipe (each seed sets the initial weights and the order of the data)
    lr_b: float            # recipe B's learning rate (recipe A has lr)
    wd_c: float            # recipe C's weight decay (A and B have weight_decay)
    weight_decay: float    # recipes A and B
    margin: float          # nats: a difference inside ±margin is "the same" for section 4
    confidence: float      # of every interval
    task_steps: int        # training steps of the addition model (section 5); checkpoints at half and at the end
    task_problems: int     # held-out problems it is graded on

    RANGES = {"SEEDS": (2, 200), "TASK_STEPS": (2, 100_000), "TASK_PROBLEMS": (1, 2_000)}

    def __post_init__(self):
        super().__post_init__()
        check_range("CONFIDENCE", self.confidence, 0.0, 1.0, open_lo=True, open_hi=True)
        check_range("MARGIN", self.margin, 0.0, 10.0, open_lo=True)


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=1, n_embd=32, n_head=2, block_size=32, batch_size=16, steps=80,
                      lr=3e-3, seeds=6, lr_b=2e-3, wd_c=0.0, weight_decay=0.1, margin=0.005, confidence=0.95,
                      task_steps=300, task_problems=400),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, n_head=4, block_size=64, batch_size=16, steps=200, lr=3e-3,
                    seeds=12, lr_b=2e-3, wd_c=0.0, weight_decay=0.1, margin=0.01, confidence=0.95, task_steps=600,
                    task_problems=1000),
    "gpu": Settings(profile="gpu", n_layer=4, n_embd=128, n_head=4, block_size=128, batch_size=32, steps=500,
                    lr=3e-3, seeds=24, lr_b=2e-3, wd_c=0.0, weight_decay=0.1, margin=0.01, confidence=0.95,
                    task_steps=2000, task_problems=2000),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
