"""Lesson 08, your turn: ZeRO-1's partition of the parameters over the ranks, checked against the partition
torch's ZeroRedundancyOptimizer really made on this lesson's ranks (section 1's launches)."""

import inspect

from labtools.exercises import Outcome, attempt, failed, outcome
from labtools.learner import BOUND_FLOOR_S, time_bound
from lessons.fsdp_zero import Strategy
from lessons.fsdp_zero.ranks import ShardingResult

HINT = ("largest parameters first (sorted by size, ties in their original order); each goes to the rank that holds "
        "the fewest elements so far, the lowest rank on a tie")


def reference(sizes, N):
    """ZeRO-1's partition: for each of the N ranks, the indices of the parameters whose optimizer state it keeps."""
    held = [0] * N                        # elements assigned to each rank so far
    ranks = [[] for _ in range(N)]
    for i in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):  # largest first (a stable sort)
        r = held.index(min(held))         # the least-loaded rank; the lowest one on a tie
        ranks[r].append(i)
        held[r] += sizes[i]
    return [sorted(r) for r in ranks]


def measured_cases(shard: dict[int, list[ShardingResult]]) -> list[tuple]:
    """(name, sizes, N, the partition ZeroRedundancyOptimizer made) from section 1's launches."""
    out = []
    for world, res in sorted(shard.items()):
        sizes = res[0].sizes
        out.append((f"this GPT's {len(sizes)} parameters on {world} ranks", sizes, world,
                    [r.strategies[Strategy.ZERO1].partition for r in res]))
    return out


def check_partition(fn, shard: dict[int, list[ShardingResult]]) -> Outcome:
    """Your partition against ZeroRedundancyOptimizer's on every world size section 1 launched, and two small cases
    (equal sizes; one parameter larger than all the others) against the same rule."""
    cases = measured_cases(shard) + [("four equal parameters on 2 ranks", [6, 6, 6, 6], 2, None),
                                     ("one giant and four small on 2 ranks", [1, 1, 100, 1, 1], 2, None)]
    results = []
    for name, sizes, N, expected in cases:
        expected = expected if expected is not None else reference(sizes, N)
        tried = attempt(fn, list(sizes), N, case=name, hint=HINT)
        if not tried.returned:
            return tried.outcome
        try:
            with time_bound(BOUND_FLOOR_S):
                got = [sorted(int(i) for i in r) for r in tried.value]
        except TypeError:
            return failed(name, "return one list of parameter indices per rank")
        if got != expected:
            r = next((k for k in range(N) if k >= len(got) or got[k] != expected[k]), 0)
            return failed(name, f"rank {r} should hold parameters {expected[r]}, yours holds "
                                f"{got[r] if r < len(got) else 'nothing'}", HINT)
        results.append({"case": name, "difference": 0.0})
    return outcome(results, tol=0.0, what="your partition", reference="ZeroRedundancyOptimizer's")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_zero1_partition(")
