"""Lesson 08, your turn: ZeRO-1's partition of the parameters over the ranks, checked against the partition
torch's ZeroRedundancyOptimizer really made on this lesson's ranks (section 1's launches)."""

import inspect
from dataclasses import dataclass

from labtools.exercises import (YOURS_NOT_WRITTEN, Outcome, YourRun, attempt, compare_runs, failed, launch_yours,
                                losses_history, outcome)
from labtools.learner import BOUND_FLOOR_S, is_stub, source_of, time_bound
from lessons.fsdp_zero import Settings, Strategy
from lessons.fsdp_zero.partition_ranks import PartitionJob, train_with_partition
from lessons.fsdp_zero.ranks import EquivalenceResult, ShardingResult

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


TRAIN_TOL = 1e-4       # nats: the same AdamW on the same averaged gradients, split by parameter
TRAIN_TIMEOUT_S = 120  # the whole launch; a rank left waiting ends sooner, at the collective timeout


@dataclass(frozen=True)
class PartitionRun:
    """ZeRO-1 trained with your partition, beside section 3's DDP run, and each rank's optimizer state against the
    state ZeroRedundancyOptimizer kept in section 1."""
    run: YourRun
    state_bytes: list[int] | None = None        # yours, per rank
    torch_state_bytes: list[int] | None = None  # ZeroRedundancyOptimizer's, per rank

    def _repr_html_(self) -> str:
        return self.run._repr_html_()

    def show(self, title: str) -> None:
        from IPython.display import Markdown, display
        self.run.show(title)
        if self.state_bytes:
            display(Markdown(f"Each rank's optimizer state: yours {_mib(self.state_bytes)}, PyTorch's ZeRO-1 "
                             f"{_mib(self.torch_state_bytes)}."))


def _mib(values: list[int]) -> str:
    return " and ".join(f"{v / 2**20:.2f} MiB" for v in values)


def train_with_yours(fn, S: Settings, shard: dict[int, list[ShardingResult]],
                     eq: list[EquivalenceResult]) -> PartitionRun:
    """Section 3's DDP run made again as ZeRO-1 on real ranks, with your partition deciding which rank keeps each
    parameter's AdamW state and updates it. Your partition must first pass its check on this model."""
    n = min(shard)
    lab = losses_history(eq[0].ddp.losses)
    if is_stub(fn):
        return PartitionRun(YourRun(Outcome("not written", YOURS_NOT_WRITTEN), lab))
    sizes = shard[n][0].sizes
    expected = [r.strategies[Strategy.ZERO1].partition for r in shard[n]]
    tried = attempt(fn, list(sizes), n, case=f"this GPT on {n} ranks", hint=HINT)
    if not tried.returned:
        return PartitionRun(YourRun(tried.outcome, lab))
    try:
        with time_bound(BOUND_FLOOR_S):
            same = [sorted(int(i) for i in part) for part in tried.value] == expected
    except TypeError:
        same = False
    if not same:
        return PartitionRun(YourRun(Outcome("fail", "your partition is not the one PyTorch made for this model: make "
                                                    "the check above pass first"), lab))
    ran = launch_yours(train_with_partition, n, PartitionJob(S, source_of(fn)),
                       desc=f"ZeRO-1 with your partition × {n}", timeout_s=TRAIN_TIMEOUT_S, hint=HINT)
    if isinstance(ran, Outcome):
        return PartitionRun(YourRun(ran, lab))
    if ran[0].error:
        return PartitionRun(YourRun(Outcome("fail", f"the run with your partition stopped: {ran[0].error}"), lab))
    run = compare_runs(losses_history(ran[0].losses), lab, what=f"ZeRO-1 with your partition, on {n} ranks,",
                       tol=TRAIN_TOL)
    return PartitionRun(run, [r.optimizer_bytes for r in ran],
                        [r.strategies[Strategy.ZERO1].optimizer for r in shard[n]])


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_zero1_partition(")
