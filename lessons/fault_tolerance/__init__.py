"""Lesson 11 — fault tolerance: resuming exactly, surviving crashes mid-save, sharded and elastic restarts.

The settings of notebooks/11_fault_tolerance.ipynb. One module per section:

    resume.py     the whole training state, or a partial recipe: does the resumed run match?
    crashes.py    processes killed while saving, and corrupted files
    security.py   loading a checkpoint as data (weights_only)
    sharded.py    sharded checkpoints across world sizes, and an elastic restart
    interval.py   how often to save
    exercises.py  your turn
    ranks.py      what runs inside the ranks (torch and core labtools only)
"""

import tempfile
from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.runs import LLAMA3_JOB_MTBF_H
from labtools.validate import check_range

HOUR = 3600.0


MIN_KILLS = 8  # random kills from which at least one lands mid-save (about half did here)


# Published cases (sources in the notebook): BLOOM-176B wrote 2.3 TB checkpoints in ~40 s every ~3 h; Llama 3 405B
# saw 419 unexpected interruptions in 54 days; PyTorch and IBM Research (PyTorch blog, 2024-06-12): "7B model 'down
# time' for a checkpoint goes from an average of 148.8 seconds to 6.3 seconds" with asynchronous DCP. Each save is
# put at Llama 3's failure rate: a combination of published figures, not a published run.
LLAMA3_MTBF_S = LLAMA3_JOB_MTBF_H * HOUR


CASES = {  # each published save put at Llama 3's failure rate; BLOOM's at its own interval, the others at the best
    "BLOOM-176B: 40 s, every 3 h (its own interval)": dict(save_s=40.0, interval_s=3 * HOUR, mtbf_s=LLAMA3_MTBF_S),
    "a 7B model, blocking: 148.8 s, at the best interval": dict(save_s=148.8, interval_s=None, mtbf_s=LLAMA3_MTBF_S),
    "the same 7B model, async: 6.3 s, at the best interval": dict(save_s=6.3, interval_s=None, mtbf_s=LLAMA3_MTBF_S),
}


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    every: int             # steps between checkpoints
    stop_at: int           # where the interrupted run dies (between two checkpoints)
    kills: int             # random SIGKILLs of a process that is saving
    kill_mb: int           # size of the state that process saves
    dist_steps: int        # FSDP steps before the sharded save
    save_world: int        # ranks that save the sharded checkpoint ...
    load_world: int        # ... and ranks that load it
    elastic_steps: int     # the elastic DDP run
    kill_at: int           # the step before which one of its ranks is killed

    RANGES = {"KILLS": (1, 1000)}

    def __post_init__(self):
        super().__post_init__()
        # The run dies at STOP_AT, after its first checkpoint (EVERY) and before its end (STEPS): the three bound
        # each other, so a value out of place is reported with every parameter whose range it leaves.
        errors = []
        for check in (lambda: check_range("STEPS", self.steps, self.stop_at + 1, 100_000, int),
                      lambda: check_range("EVERY", self.every, 1, self.stop_at, int),
                      lambda: check_range("STOP_AT", self.stop_at, self.every, self.steps - 1, int)):
            try:
                check()
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors) + " (EVERY ≤ STOP_AT < STEPS)")
        if not 0 < self.kill_at < self.elastic_steps:
            raise ValueError(f"kill_at must be in (0, elastic_steps), got {self.kill_at}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=32, block_size=32, batch_size=8, steps=40, every=10,
                      stop_at=27,
                      kills=8, kill_mb=8, dist_steps=3, save_world=4, load_world=2, elastic_steps=12, kill_at=7),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, steps=200, every=25, stop_at=140,
                    kills=24, kill_mb=32, dist_steps=10, save_world=4, load_world=2, elastic_steps=40, kill_at=23),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, block_size=256, batch_size=32, steps=600, every=100,
                    stop_at=430,
                    kills=24, kill_mb=256, dist_steps=20, save_world=4, load_world=2, elastic_steps=60, kill_at=37),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def workdir() -> tempfile.TemporaryDirectory:
    """A directory for the lesson's checkpoints, deleted when the notebook's kernel ends (or .cleanup())."""
    return tempfile.TemporaryDirectory(prefix="lab-11-")
