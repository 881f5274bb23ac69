"""Lesson 10, the launches every section reads: one per tensor-parallel size, dp × tp, and the one-process reference."""

from dataclasses import replace

from labtools.parallel import launch
from lessons.tensor_parallel import Settings, ranks


def run(S: Settings) -> dict:
    """A launch per tensor-parallel size (parity, collectives, memory); the 4-rank one then trains dp 2 × tp 2 on its
    ranks (a launch of its own when 4 is not among the sizes), against one process (the reference runs here, in the
    notebook's process)."""
    job_2d = replace(S, dp=2)
    out = {t: launch(ranks.lesson_run, t, job_2d if t == 4 else S, timeout_s=None,
                     desc=f"tensor parallel × {t}" + (", then dp 2 × tp 2" if t == 4 else "")) for t in S.worlds}
    if 4 in out:
        two_d = [r.pop("two_d") for r in out[4]][0]
    else:
        two_d = launch(ranks.two_d, 4, job_2d, desc="dp 2 × tp 2", timeout_s=None)[0]
    return {"tp": out, "two_d": two_d, "single": ranks.single_process(job_2d)}
