"""Lesson 02, your turn: warm-up then cosine decay, checked against labtools.schedules.warmup_cosine."""

import html
import inspect

from IPython.display import HTML, display

from labtools.exercises import Case, Outcome, check
from labtools.schedules import warmup_cosine

CASES = [
    Case("step 0", (0, 10, 100, 0.1), hint="the warm-up starts from 0: step / warmup"),
    Case("half-way through the warm-up", (5, 10, 100, 0.1)),
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
    """Your schedule against labtools.schedules.warmup_cosine at seven steps, the edges included."""
    return check(fn, _reference, CASES, tol=1e-9, what="your warm-up + cosine schedule",
                 against="labtools.schedules.warmup_cosine")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    code = inspect.getsource(reference).replace("def reference(", "def my_warmup_cosine(")
    return code.replace("  # noqa: F821 - the cell imports math", "")


def show_solution() -> None:
    """The reference solution, folded (open it once you have tried)."""
    display(HTML(f"<details><summary>A solution</summary><pre>{html.escape(solution_source())}</pre></details>"))
