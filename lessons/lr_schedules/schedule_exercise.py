"""Lesson 02, your turn: warm-up then cosine decay, checked against labtools.schedules.warmup_cosine."""

import inspect

from labtools.exercises import Case, Outcome, YourRun, check, run_yours
from labtools.schedules import warmup_cosine
from labtools.train import History
from lessons.lr_schedules import Settings, train_run

CASES = [
    Case("step 0", (0, 10, 100, 0.1), hint="the warm-up starts from 0: step / warmup"),
    Case("half-way through the warm-up", (5, 10, 100, 0.1),
         hint="the warm-up rises in a straight line through every step, 0.5 half-way: a fraction, so divide with /, "
              "not //"),
    Case("the end of the warm-up", (10, 10, 100, 0.1), hint="at step = warmup the multiplier is 1, the peak"),
    Case("half-way through the decay", (55, 10, 100, 0.1),
         hint="progress p = (step − warmup) / (total − warmup); cosine: m + (1 − m)·(1 + cos πp)/2"),
    Case("the last step", (100, 10, 100, 0.1), hint="at step = total the multiplier is min_ratio"),
    Case("past the end", (150, 10, 100, 0.1), hint="after total the schedule stays at min_ratio: clamp p to 1"),
    Case("no warm-up, floor 0", (30, 0, 60, 0.0), hint="warmup = 0: the decay starts at step 0"),
]


def _reference(step, warmup, total, min_ratio):
    return warmup_cosine(step, warmup=warmup, total=total, min_ratio=min_ratio)


def reference(step, warmup, total, min_ratio):
    """The multiplier of the peak learning rate at `step`: linear warm-up, then a half cosine to min_ratio."""
    if step < warmup:
        return step / warmup
    p = min((step - warmup) / (total - warmup), 1.0)  # progress through the decay, 0 … 1
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))  # noqa: F821 - the cell imports math


def check_schedule(fn) -> Outcome:
    """Your schedule against the lab's warmup_cosine at seven steps, the edges included."""
    return check(fn, _reference, CASES, tol=1e-9, what="your warm-up + cosine schedule",
                 against="the lab's schedule")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    code = inspect.getsource(reference).replace("def reference(", "def my_warmup_cosine(")
    return code.replace("  # noqa: F821 - the cell imports math", "")


TRAIN_TOL = 1e-3  # nats: a learning rate right to rounding trains the same curve; a warm-up one step off does not


def train_with_yours(fn, S: Settings, lab: History) -> YourRun:
    """Section 2's cosine run again, with your schedule setting the learning rate at every step: the same model,
    batches, peak and length (warm-up 10%, floor 10%, as that run)."""
    warmup = int(round(0.1 * S.budget))

    def run(schedule) -> History:
        return train_run(S, lambda step: schedule(step, warmup, S.budget, 0.1), S.budget, S.peak_lr,
                         desc="your schedule")
    return run_yours(fn, run, lab, what="your schedule", tol=TRAIN_TOL)
