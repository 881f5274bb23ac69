"""Lesson 09, the launches every section reads: one per pipeline depth p, and the one-process reference."""

from dataclasses import replace

from labtools.parallel import launch
from labtools.pipeline import Schedule
from lessons.pipeline_parallel import Settings, ranks


def run(S: Settings, p: int) -> dict:
    """One launch of p ranks: parity, simulated-compute timelines, memory, traffic and training; then the real-
    compute timelines (a second launch) where the profile asks, and the one-process training reference."""
    res = launch(ranks.lesson_run, p, S, desc=f"pipeline × {p}", timeout_s=None)
    out = {"ranks": res, "single_losses": ranks.single_process_losses(S), "real": None}
    if S.real_compute:
        real = launch(ranks.timelines, p, replace(S, simulate=False, schedules=(Schedule.GPIPE, Schedule.ONE_F_ONE_B)),
                      desc=f"real compute × {p}", timeout_s=None)
        out["real"] = real[0]["timelines"]
    return out
