"""Lesson 09 — pipeline parallelism: GPipe, 1F1B and interleaving on real ranks, and the bubble.

The settings of notebooks/09_pipeline_parallel.ipynb and the launch its sections share:

    schedule.py    a schedule drawn as a grid, with a panel
    parity.py      the pipeline's gradients and training against one process
    bubble.py      timelines and the bubble, measured against (p − 1)/(m + p − 1)
    zero_bubble.py the backward split into I and W: torch's ZBV list drawn beside 1F1B and measured
    memory.py      activations held and bytes sent per stage
    playground.py  panels over measured runs, and exercises
    ranks.py       what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.parallel.pipeline import check_pipeline
from labtools.pipeline import SCHEDULES
from labtools.validate import check_range

CURVE_WINDOW = 40  # steps over which training curves are held equal (AdamW amplifies last-bit differences)


QUOTED_EFFICIENCY = 0.789  # "4 stages, 16 micro-batches: efficiency = (16−1)/(16+4−1) = 78.9%" (widely repeated)


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    n_layer: int = 8
    block_size: int = 32
    batch_size: int = 16                          # rows of the whole batch, split into m micro-batches
    m: int = 4                                    # micro-batches of the parity check, memory, traffic and training
    micro_batches: tuple = (1, 2, 4, 8, 16)       # the timing sweep
    worlds: tuple = (2, 4)                        # pipeline depths p (one rank per stage)
    t_f_ms: float = 20.0                          # simulated forward per micro-batch per rank (backward: twice that)
    train_steps: int = 8                          # AdamW steps of 1F1B training against one process
    real_compute: bool = False                    # also time the real computation (no padding)
    v: int = 2                                    # stages per rank of the interleaved schedules
    schedules: tuple = SCHEDULES                  # the schedules the timelines run (labtools.pipeline.Schedule)
    simulate: bool = True                         # pad each action to its simulated time; False: real compute
    zero_bubble: bool = True                      # also time torch's ZBV at m = 2p (section 4's picture)

    RANGES = {"T_F_MS": (5.0, 1000.0), "TRAIN_STEPS": (1, 10_000)}

    @property
    def t_b_ms(self) -> float:
        """Simulated backward per micro-batch per rank: twice the forward."""
        return 2 * self.t_f_ms

    def __post_init__(self):
        super().__post_init__()
        check_range("M", self.m, max(self.worlds), self.batch_size, int)  # torch's Schedule1F1B needs m >= p
        for p in self.worlds:
            check_pipeline(self.n_layer, p, self.m, self.v)
        for m in (self.m, *self.micro_batches):
            if self.batch_size % m:
                raise ValueError(f"M (and the swept m) must divide the batch of {self.batch_size} rows, got {m}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=8, n_embd=64, block_size=32, batch_size=16, m=4,
                      micro_batches=(1, 2, 4, 8, 16), worlds=(2, 4), t_f_ms=20.0, train_steps=8, real_compute=False),
    "cpu": Settings(profile="cpu", n_layer=8, n_embd=64, block_size=32, batch_size=16, m=8,
                    micro_batches=(1, 2, 4, 8, 16), worlds=(2, 4), t_f_ms=20.0, train_steps=40, real_compute=True),
    "gpu": Settings(profile="gpu", n_layer=8, n_embd=384, block_size=256, batch_size=32, m=8,
                    micro_batches=(1, 2, 4, 8, 16, 32),
                    worlds=(2, 4), t_f_ms=20.0, train_steps=100, real_compute=True),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
