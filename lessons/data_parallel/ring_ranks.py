"""Lesson 07's other rank functions: the collectives primer (every collective on real ranks, its picture checked)
and your ring all-reduce on real ranks (the exercise of section 2).

Launched from notebooks/07_data_parallel.ipynb through lessons/data_parallel/collectives.py and ring_exercise.py.
"""

import time
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from labtools.learner import LEARNER_ERRORS, TookTooLong, bound_for, load_function, time_bound, where_it_failed
from labtools.keys import Key
from labtools.parallel.comm import ring_all_reduce, ring_steps
from labtools.parallel.toolkit import rank, world_size
from lessons.data_parallel import Settings

# --- your ring, on real ranks (the exercise of section 2) -----------------------------------------------------



@dataclass(frozen=True)
class RingExercise:
    """A learner's ring all-reduce, sent as source, the tensor sizes to try it on (uneven and tiny ones too), and
    the lesson's settings: once the ring is right, DDP trains the lesson's model with it (ddp_steps steps)."""
    source: str = ""
    name: str = "my_ring_all_reduce"
    sizes: tuple[int, ...] = (12, 7, 2)
    settings: Settings | None = None
    ddp_steps: int = 3


@dataclass(frozen=True)
class RingCase:
    """One case of the learner's ring on one rank: a tensor size, or the cell itself when it does not compile."""
    case: str
    bytes: int | None = None         # the tensor's bytes (M)
    difference: float | None = None  # max |Δ| against dist.all_reduce; None when it raised
    sent: int | None = None          # bytes this rank sent through exchange()
    ring_sent: int | None = None     # bytes a ring all-reduce sends from this rank: 2(N − 1) chunks of about M/N
    hint: str = ""
    error: str = ""                  # the learner's line that raised, if one did
    waiting: bool = False            # the error is this rank's waiting for a neighbour that did not send


@dataclass(frozen=True)
class RingExerciseResult:
    """One rank's cases, in order; the first that raised is the last. Then DDP with the learner's ring as its
    all-reduce: its buckets' largest difference from dist.all_reduce's mean, and the global loss per step."""
    cases: list[RingCase]
    ddp_difference: float | None = None
    ddp_losses: list[float] | None = None


COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")


class refusing_collectives:
    """Within the block, torch.distributed's collectives and sends raise, naming themselves, unless called through
    `allowed` (exchange() holds the originals): the learner's ring must pass its chunks with exchange()."""

    def __init__(self):
        self.saved = {name: getattr(dist, name) for name in COLLECTIVES}

    def __enter__(self):
        for name in COLLECTIVES:
            def refused(*args, _name=name, **kwargs):
                raise RuntimeError(f"torch.distributed.{_name} is not part of this exercise: pass the chunks around "
                                   "the ring with exchange()")
            setattr(dist, name, refused)
        return self.saved

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)
        return False


def ring_sent(size: int, n: int, r: int, element_size: int = 4) -> int:
    """Bytes rank r sends in a ring all-reduce of `size` elements over n ranks: the chunk of each of its 2(n − 1)
    steps, as tensor_split makes them (an uneven size counts exactly)."""
    chunks = [len(c) for c in torch.arange(size).tensor_split(n)]
    return sum(chunks[send] for _, send, _ in ring_steps(n, r)) * element_size


class _ExerciseDist:
    """What the exercise may use of torch.distributed: who am I, how many are we. exchange() does the sending."""

    get_rank, get_world_size = staticmethod(dist.get_rank), staticmethod(dist.get_world_size)

    def __getattr__(self, name):
        raise AttributeError(f"dist.{name} is not part of this exercise: pass chunks around the ring with exchange()")


def _ring_hint(x: torch.Tensor, want: torch.Tensor, n: int, before: torch.Tensor, returned) -> str:
    in_place = ("the sum must be written into x itself: tensor_split gives views of x, so add into them and copy "
                "into them in place (+=, .copy_()); `chunks[i] = chunks[i] + …` makes a new tensor that x never sees")
    if isinstance(returned, torch.Tensor) and returned.shape == want.shape and torch.allclose(returned, want):
        return f"your function returned the sum, but x still holds the old values: {in_place}"
    if torch.equal(x, before):
        return f"x is as it was before the call: {in_place}"
    right = sum(torch.equal(a, b) for a, b in zip(x.tensor_split(n), want.tensor_split(n)))
    if right == 1:
        return ("one chunk is right, the others are not: after the reduce-scatter each rank holds the full sum of one "
                "chunk only; n − 1 more steps (copying, not adding) pass the finished chunks around")
    return ("at step s of the reduce-scatter rank r sends chunk (r − s) mod n and adds the arriving one into chunk "
            "(r − s − 1) mod n; check which chunk you send and where the incoming one goes")


def ring_exercise(job: RingExercise) -> RingExerciseResult:
    """Run the learner's ring on a tensor of each size (every rank's values differ) against dist.all_reduce, and
    count the bytes it sent through exchange(). Each rank reports its own cases."""
    n, r = world_size(), rank()
    sent = 0

    guard = refusing_collectives()
    isend, irecv = guard.saved["isend"], guard.saved["irecv"]
    deadline = 0.0

    def exchange(chunk: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Send chunk to the right-hand neighbour; return what arrived from the left, shaped like `like`."""
        nonlocal sent
        incoming = torch.empty_like(like)
        for q in [isend(chunk.contiguous(), (r + 1) % n), irecv(incoming, (r - 1) % n)]:
            try:
                q.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except RuntimeError:
                if time.monotonic() < deadline:
                    raise
                raise TookTooLong(f"your function did not finish in time: waiting in exchange() for rank "
                                  f"{(r - 1) % n}'s chunk") from None
        sent += chunk.numel() * chunk.element_size()
        return incoming

    try:
        fn = load_function(job.source, job.name, {"torch": torch, "dist": _ExerciseDist()})
    except Exception as e:  # noqa: BLE001 - the learner's cell does not compile: say so, on every rank alike
        return RingExerciseResult([RingCase("your cell", error=where_it_failed(e, f"<your {job.name}>"))])
    cases = []
    for size in job.sizes:
        x = torch.arange(size, dtype=torch.float32) * (r + 1) + r  # different on every rank
        want = x.clone()
        dist.all_reduce(want)
        start = time.perf_counter()
        ring_all_reduce(x.clone())  # the lab's ring, timed: your time bound is a multiple of it
        bound = bound_for(time.perf_counter() - start)
        sent = 0
        case = RingCase(f"{size} elements on {n} ranks", bytes=x.numel() * x.element_size(),
                        ring_sent=ring_sent(size, n, r, x.element_size()))
        try:
            deadline = time.monotonic() + bound
            before = x.clone()
            with guard, time_bound(bound):
                returned = fn(x, exchange)
        except LEARNER_ERRORS as e:  # reported as the learner's line, not a traceback or an exit
            error = where_it_failed(e, f"<your {job.name}>", job.source)
            hint = ("check that every loop's counter moves, and that every rank calls exchange() the same number of "
                    "times" if isinstance(e, TookTooLong) else "")
            cases.append(replace(case, error=f"rank {r}: {error}", waiting="exchange()" in str(e), hint=hint))
            break  # the peers may now wait for this rank: their own bound, or the collective timeout, ends them
        diff = (x - want).abs().max().item() if size else 0.0
        cases.append(replace(case, difference=diff, sent=sent,
                             hint=_ring_hint(x, want, n, before, returned) if diff else ""))
    if job.settings is None or any(c.error or c.difference > 1e-6 for c in cases):
        return RingExerciseResult(cases)

    def your_ring(x: torch.Tensor):
        nonlocal deadline
        start = time.perf_counter()
        ring_all_reduce(x.clone())
        bound = bound_for(time.perf_counter() - start)
        deadline = time.monotonic() + bound
        with guard, time_bound(bound):
            fn(x, exchange)

    try:
        gap, losses = ddp_with(your_ring, job.settings, job.ddp_steps)
    except LEARNER_ERRORS as e:
        error = where_it_failed(e, f"<your {job.name}>", job.source)
        return RingExerciseResult(cases + [RingCase("DDP with your ring", error=f"rank {r}: {error}",
                                                    waiting="exchange()" in str(e))])
    return RingExerciseResult(cases, ddp_difference=gap, ddp_losses=losses)


def ddp_with(ring, S, steps: int) -> tuple[float, list[float]]:
    """DDP on the lesson's model for `steps` AdamW steps, every bucket all-reduced by ring(x) (in place) instead of
    gloo's all-reduce: the largest difference of a bucket's mean from dist.all_reduce's on the same numbers, and the
    global loss per step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labtools.config import build_gpt, global_batch
    from labtools.parallel.toolkit import mean_over_ranks, rank_rows
    n, gap = world_size(), [0.0]

    def hook(state, bucket):
        buf = bucket.buffer()
        want = buf.clone()
        dist.all_reduce(want)
        ring(buf)
        gap[0] = max(gap[0], (buf - want).abs().max().item() / max(want.abs().max().item(), 1e-12))
        buf.div_(n)
        done = torch.futures.Future()
        done.set_result(buf)
        return done

    model = DDP(build_gpt(S))
    model.register_comm_hook(None, hook)
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr)
    g, losses = torch.Generator().manual_seed(S.seed + 1), []
    for _ in range(steps):
        X, Y = global_batch(S, g, n * S.batch_size)
        loss = model(rank_rows(X), rank_rows(Y))[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(mean_over_ranks(loss.item()))
    return gap[0], losses


# --- the collectives primer: each collective's "after", from real ranks ------------------------------------------


class Collective(Key):
    """A collective of the primer (the value is torch.distributed's name; the ring is labtools' written-out one)."""
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_REDUCE = "all_reduce"
    RING_ALL_REDUCE = "ring_all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"


@dataclass(frozen=True)
class CollectivesResult:
    """What one rank held after each collective: its chunks, each the bitmask of the ranks whose values it sums
    (None where the rank holds no data)."""
    held: dict[Collective, list[int | None]]


def collectives() -> CollectivesResult:
    """Each collective on N chunks of one element per rank, rank r's values 2^r (exact in float64), so a value
    is the bitmask of the ranks it sums. The ring is labtools' written-out one; the rest are torch.distributed's."""
    n, r, chunk = world_size(), rank(), 1
    mine = lambda: torch.full((n * chunk,), float(2 ** r), dtype=torch.float64)  # noqa: E731 - a fresh copy each
    masks = lambda t: [int(c[0].item()) for c in t.view(n, chunk)]  # noqa: E731 - one value per chunk
    C, out = Collective, {}
    x = mine() if r == 0 else torch.zeros(n * chunk, dtype=torch.float64)
    dist.broadcast(x, src=0)
    out[C.BROADCAST] = masks(x)
    x = mine()
    dist.reduce(x, dst=0)
    out[C.REDUCE] = masks(x) if r == 0 else masks(mine())  # the root's result; the others keep their input
    x = mine()
    dist.all_reduce(x)
    out[C.ALL_REDUCE] = masks(x)
    x = mine()
    ring_all_reduce(x)
    out[C.RING_ALL_REDUCE] = masks(x)
    mine_chunk = torch.empty(chunk, dtype=torch.float64)
    dist.reduce_scatter_tensor(mine_chunk, mine())
    out[C.REDUCE_SCATTER] = [int(mine_chunk[0].item()) if c == r else None for c in range(n)]
    x = torch.empty(n * chunk, dtype=torch.float64)
    dist.all_gather_into_tensor(x, mine()[r * chunk:(r + 1) * chunk])
    out[C.ALL_GATHER] = masks(x)
    x = torch.empty(n * chunk, dtype=torch.float64)
    dist.all_to_all_single(x, mine())
    out[C.ALL_TO_ALL] = masks(x)
    return CollectivesResult(out)
