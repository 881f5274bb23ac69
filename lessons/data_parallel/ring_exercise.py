"""Lesson 07, your turn: write the ring all-reduce and run it on real ranks, checked against dist.all_reduce; then
DDP trains the lesson's model with it as its all-reduce (a communication hook), every bucket compared as it goes."""

import dataclasses
import inspect
import re


from labtools.exercises import NOT_WRITTEN, Outcome, outcome, rank_failure
from labtools.learner import is_stub, source_of
from labtools.layout import collective_bytes
from labtools.parallel import RankFailed, RunTimedOut, launch
from lessons.data_parallel import Settings, ring_ranks
from lessons.data_parallel.ring_ranks import RingCase, RingExercise

COLLECTIVE_TIMEOUT_S = 20  # a ring whose ranks disagree waits for a message that never comes: end it soon
# Your function has a bound of its own on the ranks (a multiple of the lab's ring's time). This one is the
# whole launch's, for what that cannot stop (a call into C that never returns): the lab's ring takes 4-8 s here,
# most of it starting the processes
EXERCISE_TIMEOUT_S = 60


def reference(x, exchange):
    """Sum x over all ranks in place. exchange(chunk, like) sends `chunk` to the right-hand neighbour and returns
    the chunk that arrived from the left (shaped like `like`)."""
    n, r = dist.get_world_size(), dist.get_rank()  # noqa: F821 - the ranks provide dist (and torch)
    chunks = list(x.view(-1).tensor_split(n))  # views into x: what lands in a chunk lands in x
    for s in range(n - 1):  # reduce-scatter: afterwards rank r holds the full sum of chunk (r + 1) mod n
        send, recv = (r - s) % n, (r - s - 1) % n
        chunks[recv] += exchange(chunks[send], chunks[recv])
    for s in range(n - 1):  # all-gather: pass each finished chunk once around the ring
        send, recv = (r + 1 - s) % n, (r - s) % n
        chunks[recv].copy_(exchange(chunks[send], chunks[recv]))


def check(fn, S: Settings) -> Outcome:
    """Run fn on S.exercise_worlds gloo ranks (each a real launch) on tensors of several sizes, against
    dist.all_reduce; on success, say how many bytes it sent per rank beside 2(N − 1)/N · M."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    job = RingExercise(source=source_of(fn), name=fn.__name__, settings=S)
    sent = []
    for world in S.exercise_worlds:
        try:
            res = launch(ring_ranks.ring_exercise, world, job, backend="gloo",
                         collective_timeout_s=COLLECTIVE_TIMEOUT_S, timeout_s=EXERCISE_TIMEOUT_S,
                         desc=f"your ring × {world}")
        except RunTimedOut as e:
            return Outcome("fail", f"your function did not finish in {e.seconds:.0f} s on {world} ranks"
                                   + _where(e.where, job.source) + " — hint: a loop whose counter never moves, or a "
                                   "rank waiting for a message its neighbour never sends")
        except RankFailed as e:
            hint = ("the two ranks of an exchange() disagree on the chunk: the one a rank sends is the one its "
                    "neighbour receives into. At step s of the reduce-scatter rank r sends chunk (r − s) mod n and "
                    "adds the arriving one into chunk (r − s − 1) mod n" if "size doesn't match" in (e.logs or "")
                    else "every rank must call exchange() the same number of times, 2(n − 1), in the same order")
            return Outcome("fail", f"on {world} ranks the run stopped: {rank_failure(e)} — hint: {hint}")
        per_case = [max((r.cases[i] for r in res if i < len(r.cases)), key=_badness)
                    for i in range(max(len(r.cases) for r in res))]
        verdict = outcome([dataclasses.asdict(c) for c in per_case], tol=1e-6, what="your ring",
                          reference=f"dist.all_reduce on {world} ranks")
        if not verdict.passed:
            return verdict
        extra = [c for r in res for c in r.cases if c.sent != c.ring_sent]
        if extra:
            c = extra[0]
            return Outcome("fail", f"case {c.case!r}: the sum is right, but a rank sent {c.sent:,} bytes where a ring "
                                   f"all-reduce sends {c.ring_sent:,} — hint: each of the 2(n − 1) steps passes one "
                                   "chunk of about M/n to the neighbour, not the whole tensor")
        ddp_error = next((c for r in res for c in r.cases if c.case == "DDP with your ring" and c.error), None)
        if ddp_error:
            return Outcome("fail", f"your ring passed every tensor, but inside DDP on {world} ranks: {ddp_error.error}")
        gap = max(r.ddp_difference for r in res)
        if not gap <= 1e-6:
            return Outcome("fail", f"inside DDP on {world} ranks your ring's sums differ from dist.all_reduce's by a "
                                   f"relative {gap:.1e} — hint: DDP's buckets are long, flat tensors: check sizes "
                                   "that do not divide by the number of ranks")
        trained = (world, res[0].ddp_losses)
        sent += [(world, per_case[0].sent, per_case[0].bytes)]
    bytes_note = "; ".join(f"N = {n}: {b:,} bytes sent per rank for {m:,} (2(N−1)/N · M = "
                           f"{collective_bytes('all_reduce', m, n):,.0f})" for n, b, m in sent)
    world, losses = trained
    return Outcome("pass", f"your ring matches dist.all_reduce on {len(S.exercise_worlds)} launch(es) × "
                           f"{len(job.sizes)} tensor sizes ({bytes_note}); then DDP trained the lesson's model on "
                           f"{world} ranks with your ring as its all-reduce, the loss going from {losses[0]:.3f} to "
                           f"{losses[-1]:.3f} in {len(losses)} steps", 0.0)


def _where(where: dict[int, tuple[str, int]], source: str) -> str:
    """': rank 0 was at line 5 of your function (`while s < n - 1:`)', from the ranks' stacks."""
    if not where:
        return ""
    r, (_, line) = min(where.items())
    lines = source.splitlines()
    text = f" (`{lines[line - 1].strip()}`)" if 0 < line <= len(lines) else ""
    return f": rank {r} was at line {line} of your function{text}"


def _badness(case: RingCase) -> float:
    """An error of the rank's own first (a rank waiting for its neighbour only follows it), then the difference."""
    return float("inf") if case.error and not case.waiting else 1e300 if case.error else case.difference


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return re.sub(r"  # noqa.*", "", inspect.getsource(reference)).replace("def reference(", "def my_ring_all_reduce(")
