"""Lesson 09, your turn: the 1F1B order of actions of one rank, checked against the order torch's Schedule1F1B
really ran on this lesson's ranks (section 3's timed launches), and against the rule where torch does not run
(m < p)."""

import inspect
from dataclasses import dataclass

from labtools.exercises import Outcome, attempt, failed, outcome
from labtools.pipeline import Schedule, schedule_order
from lessons.pipeline_parallel.launches import DepthRun

HINT = ("rank r first runs min(m, p − r) forwards; then, while forwards remain, one backward and one forward; then "
        "the remaining backwards, oldest micro-batch first")


def reference(r, p, m):
    """Rank r's actions under 1F1B with p stages and m micro-batches: ("F", i) or ("B", i), in order."""
    warmup = min(m, p - r)                       # forwards that fill the pipeline below this rank
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):                  # steady state: one backward, then one forward
        order += [("B", i), ("F", warmup + i)]
    return order + [("B", i) for i in range(m - warmup, m)]


@dataclass(frozen=True)
class RanOrder:
    """The order one timed 1F1B run took on its ranks."""
    p: int
    m: int
    orders: list[list[tuple]]  # each rank's actions as ("F" or "B", micro-batch), in the order it ran them


def torch_orders(results: dict[int, DepthRun]) -> list[RanOrder]:
    """Each 1F1B run torch's Schedule1F1B made in the timed launches, with the order each rank ran its actions in."""
    return [RanOrder(p, run.m, [[(iv["kind"][0].upper(), iv["mb"]) for iv in run.intervals if iv["row"] == r]
                                for r in range(p)])
            for p, res in results.items() for run in res.timelines if run.schedule == Schedule.ONE_F_ONE_B]


def rule_orders(p: int, m: int) -> list[list[tuple]]:
    """labtools.pipeline.schedule_order's 1F1B, as (kind, micro-batch) pairs."""
    return [[(a.kind, a.mb) for a in rank] for rank in schedule_order(Schedule.ONE_F_ONE_B, p, m)]


def actions(fn, r: int, p: int, m: int) -> list[tuple]:
    """fn(r, p, m) read as (kind, micro-batch) pairs ("F" or "B", an int): a generator's body runs here too."""
    return [(str(k).upper(), int(i)) for k, i in fn(r, p, m)]


def check_order(fn, results: dict[int, DepthRun]) -> Outcome:
    """Your order for every rank of every 1F1B run torch made here, and two runs with fewer micro-batches than
    stages (which torch's Schedule1F1B refuses) against the rule."""
    measured = sorted(torch_orders(results), key=lambda run: (run.p, run.m))
    cases = [(f"p = {run.p}, m = {run.m} (torch's run)", run.p, run.m, run.orders) for run in measured]
    cases += [(f"p = {p}, m = {m} (fewer micro-batches than stages)", p, m, rule_orders(p, m)) for p, m in ((4, 2),
                                                                                                            (3, 1))]
    results_ = []
    for name, p, m, expected in cases:
        for r in range(p):
            tried = attempt(actions, fn, r, p, m, case=f"{name}, rank {r}", hint=HINT, whose=fn)
            if not tried.returned:
                return tried.outcome
            got = tried.value
            if got != expected[r]:
                k = next((j for j in range(len(expected[r])) if j >= len(got) or got[j] != expected[r][j]),
                         len(expected[r]))
                want = expected[r][k] if k < len(expected[r]) else "nothing more"
                had = got[k] if k < len(got) else "nothing"
                return failed(f"{name}, rank {r}", f"action {k + 1} should be {want}, yours is {had}", HINT)
        results_.append({"case": name, "difference": 0.0})
    return outcome(results_, tol=0.0, what="your 1F1B order, every rank,",
                   reference="the order torch's Schedule1F1B ran (and the rule where it cannot run)")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_1f1b_order(")
