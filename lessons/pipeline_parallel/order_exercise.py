"""Lesson 09, your turn: the 1F1B order of actions of one rank, checked against the order torch's Schedule1F1B
really ran on this lesson's ranks (section 3's timed launches), and against the rule where torch does not run
(m < p)."""

import inspect
from dataclasses import dataclass

from labtools.exercises import (YOURS_NOT_WRITTEN, Outcome, YourRun, attempt, compare_runs, failed, launch_yours,
                                losses_history, outcome)
from labtools.learner import is_stub, source_of
from labtools.pipeline import Schedule, schedule_order
from lessons.pipeline_parallel import Settings
from lessons.pipeline_parallel.launches import DepthRun
from lessons.pipeline_parallel.order_ranks import OrderJob, train_with_order

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
    out = []
    for a in fn(r, p, m):
        if not (isinstance(a, (tuple, list)) and len(a) == 2):
            raise TypeError(f"each action is a pair (\"F\", i) or (\"B\", i), got {a!r}")
        out.append((str(a[0]).upper(), int(a[1])))
    return out


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


TRAIN_TOL = 1e-4        # nats: the same actions in the same order give the same sums, to rounding
TRAIN_TIMEOUT_S = 120   # the whole launch; a rank left waiting ends sooner, at the collective timeout


def train_with_yours(fn, S: Settings, results: dict[int, DepthRun]) -> YourRun:
    """Section 2's 1F1B training on two ranks made again, each rank running its actions in the order your function
    gives, against the lab's run of PyTorch's Schedule1F1B. Your order must first pass its check at this p and m: a
    rank whose order is wrong waits for a message that never comes."""
    p = min(S.worlds)
    lab = losses_history(results[p].ranks[0].training.losses)
    if is_stub(fn):
        return YourRun(Outcome("not written", YOURS_NOT_WRITTEN), lab)
    for r, expected in enumerate(rule_orders(p, S.m)):
        tried = attempt(actions, fn, r, p, S.m, case=f"p = {p}, m = {S.m}, rank {r}", hint=HINT, whose=fn)
        if not tried.returned:
            return YourRun(tried.outcome, lab)
        if tried.value != expected:
            return YourRun(Outcome("fail", f"your order for rank {r} at p = {p}, m = {S.m} is not 1F1B's, so the "
                                           "pipeline would stall: make the check above pass first"), lab)
    ran = launch_yours(train_with_order, p, OrderJob(S, source_of(fn)), desc=f"1F1B with your order × {p}",
                       timeout_s=TRAIN_TIMEOUT_S, hint=HINT)
    if isinstance(ran, Outcome):
        return YourRun(ran, lab)
    if ran[0].error:
        return YourRun(Outcome("fail", f"the run with your order stopped: {ran[0].error}"), lab)
    return compare_runs(losses_history(ran[0].losses), lab, what=f"your 1F1B order, on {p} ranks,", tol=TRAIN_TOL)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_1f1b_order(")
