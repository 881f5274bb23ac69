"""Lesson 10, the launches every section reads: one per tensor-parallel size, dp × tp, and the one-process reference."""

from dataclasses import dataclass, replace

from labtools.parallel import launch
from labtools.parallel.diagnose import Ranks
from lessons.tensor_parallel import Settings, ranks
from lessons.tensor_parallel.ranks import TrainingResult


@dataclass(frozen=True)
class LessonRuns:
    """What the lesson measured: each tensor-parallel size's ranks, and dp 2 × tp 2 training against one process."""
    tp: dict[int, Ranks]    # tensor-parallel size -> each rank's ranks.TensorParallelRun; .dist[r]: where r ran
    two_d: TrainingResult   # dp 2 × tp 2 on four ranks (rank 0's: every rank holds the same losses)
    single: TrainingResult  # the same steps in one process


def run(S: Settings) -> LessonRuns:
    """A launch per tensor-parallel size (parity, collectives, memory); the 4-rank one then trains dp 2 × tp 2 on its
    ranks (a launch of its own when 4 is not among the sizes), against one process (the reference runs here, in the
    notebook's process)."""
    job_2d = replace(S, dp=2)
    out = {t: launch(ranks.lesson_run, t, job_2d if t == 4 else S, timeout_s=None,
                     desc=f"tensor parallel × {t}" + (", then dp 2 × tp 2" if t == 4 else "")) for t in S.worlds}
    if 4 in out:
        two_d = out[4][0].two_d
    else:
        two_d = launch(ranks.two_d, 4, job_2d, desc="dp 2 × tp 2", timeout_s=None)[0]
    return LessonRuns(tp=out, two_d=two_d, single=ranks.single_process(job_2d))
