"""Lesson 09, the launches every section reads: one per pipeline depth p, and the one-process reference."""

from dataclasses import dataclass, replace

from labtools.parallel import launch
from labtools.parallel.diagnose import Ranks
from labtools.pipeline import Schedule
from lessons.pipeline_parallel import Settings, ranks
from lessons.pipeline_parallel.ranks import Timeline


@dataclass(frozen=True)
class DepthRun:
    """What the lesson measured at one pipeline depth p."""
    ranks: Ranks                  # each rank's ranks.PipelineRun, in rank order; .dist[r]: where rank r ran
    single_losses: list[float]    # the same training steps in one process
    real: list[Timeline] | None   # the real-compute timelines (None: the profile times simulated compute only)

    @property
    def timelines(self) -> list[Timeline]:
        """The simulated-compute timelines, every rank's intervals (rank 0 gathered them)."""
        return self.ranks[0].timelines


def run(S: Settings, p: int) -> DepthRun:
    """One launch of p ranks: parity, simulated-compute timelines, memory, traffic and training; then the real-
    compute timelines (a second launch) where the profile asks, and the one-process training reference."""
    res = launch(ranks.lesson_run, p, S, desc=f"pipeline × {p}", timeout_s=None)
    single = ranks.single_process_losses(S)
    real = None
    if S.real_compute:
        real = launch(ranks.timelines, p, replace(S, simulate=False, schedules=(Schedule.GPIPE, Schedule.ONE_F_ONE_B)),
                      desc=f"real compute × {p}", timeout_s=None)[0].timelines
    return DepthRun(ranks=res, single_losses=single, real=real)
