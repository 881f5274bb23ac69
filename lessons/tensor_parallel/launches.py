"""Lesson 10, the launches every section reads: one per tensor-parallel size, dp × tp, and the one-process reference."""

from dataclasses import replace

from labtools.parallel import launch
from lessons.tensor_parallel import Settings, ranks


def run(S: Settings) -> dict:
    """A launch per tensor-parallel size (parity, collectives, memory), then dp 2 × tp 2 on 4 ranks against one
    process (the reference runs here, in the notebook's process)."""
    out = {t: launch(ranks.lesson_run, t, S, desc=f"tensor parallel × {t}", timeout_s=None) for t in S.worlds}
    two_d = launch(ranks.two_d, 4, replace(S, dp=2), desc="dp 2 × tp 2", timeout_s=None)
    return {"tp": out, "two_d": two_d[0], "single": ranks.single_process(replace(S, dp=2))}
