"""Lesson 14's rank functions: ring attention on c ranks, contiguous and zig-zag, against one process's attention;
its bytes counted and on the wire, its work and CPU time per rank, what it keeps for backward; and torch's own
context_parallel, tried.

Launched from notebooks/14_context_parallel.ipynb through lessons/context_parallel/, or by hand:

    $ python -m labtools.parallel make-job lessons.context_parallel.ranks:lesson_run '{}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 4 -m labtools.parallel.worker RUN/job.json
"""

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labtools.learner import LEARNER_ERRORS, bound_for, load_function, time_bound, where_it_failed
from labtools.memory import saved_activations
from labtools.parallel.comm import WireBytes
from labtools.parallel.context import (LAYOUTS, SeqLayout, attend, block_attention, merge, pieces, positions,
                                       ring_attention)
from labtools.parallel.toolkit import device, rank, report_progress, world_size
from lessons.context_parallel import Settings


def tensors(S: Settings) -> tuple[torch.Tensor, ...]:
    """q, k, v and the loss's weights R (loss = Σ out · R), one sequence, the same on every rank."""
    g = torch.Generator().manual_seed(S.seed)
    shape = (1, S.heads, S.seq, S.head_dim)
    return tuple(torch.randn(shape, generator=g).to(device()) for _ in range(4))


def reference(S: Settings) -> dict[str, torch.Tensor]:
    """One process's causal attention over the whole sequence: the output and the gradients of q, k, v."""
    q, k, v, R = tensors(S)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (out * R).sum().backward()
    return {"out": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}


def _ring(S: Settings, layout: SeqLayout, counter: dict | None) -> dict[str, torch.Tensor]:
    q, k, v, R = tensors(S)
    pos = positions(S.seq, world_size(), rank(), layout)
    ql, kl, vl = (t[..., pos, :].clone().requires_grad_() for t in (q, k, v))
    out = ring_attention(ql, kl, vl, pos, blocks=pieces(layout), counter=counter)
    (out * R[..., pos, :]).sum().backward()
    return {"out": out.detach(), "q": ql.grad, "k": kl.grad, "v": vl.grad}


@dataclass(frozen=True)
class TorchCP:
    """torch's own context_parallel on this backend, tried."""
    ran: bool
    max_diff: float | None = None   # largest |difference| from one process's output, where it ran
    error: str | None = None        # what it raised, where it did not


def _torch_cp(S: Settings, ref: dict) -> TorchCP:
    """torch's context_parallel on this backend: did it run, and if so how far from one process's output."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._context_parallel import context_parallel_unshard
        mesh = init_device_mesh(device().type, (world_size(),))
        q, k, v, _ = tensors(S)
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out,) = context_parallel_unshard(mesh, [out], [2])
        return TorchCP(ran=True, max_diff=(out - ref["out"]).abs().max().item())
    except Exception as e:  # noqa: BLE001 - what fails here is the finding
        return TorchCP(ran=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")


@contextmanager
def one_thread():
    """Torch on one thread within the block, as each rank runs (OMP_NUM_THREADS=1, as torchrun sets)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _reps(fn) -> int:
    """How many calls of fn make ~10 ms (fn's first call is also its warm-up)."""
    t0 = time.thread_time()
    fn()
    return max(1, math.ceil(0.01 / max(time.thread_time() - t0, 1e-6)))


@dataclass(frozen=True)
class BlockCosts:
    """CPU seconds of one block of ring attention's work, by block length (s/c: contiguous's, s/2c: zig-zag's)."""
    whole: dict[int, float]     # every key before every query
    masked: dict[int, float]    # the diagonal: the mask built and applied
    skipped: dict[int, float]   # every key after every query: only looked at
    merge: dict[int, float]     # one merge of two partial results


@dataclass(frozen=True)
class Timings:
    """Each rank's forward work and what one block costs, timed in one process on one thread (best of rounds)."""
    times: dict[SeqLayout, list[float]]   # per layout, each of c ranks' forward seconds, in rank order
    block_costs: BlockCosts


def timings(S: Settings, c: int) -> Timings:
    """In this process, on one thread, round after round: each of c ranks' forward work in both layouts (its ring
    steps' blocks, without the sends), and what one block costs at both layouts' block lengths — whole (every key
    before every query), masked (the diagonal: queries and keys at the same positions), skipped (every key after
    every query: only looked at) — and one merge. One process on one core, so what differs is the work, not which
    core or process a rank ran on (timed on the ranks themselves, four ranks on two cores differed by up to 1.6× for
    the same work, and peers waiting in a collective took the core from the rank being timed); everything
    alternates within each round, so a busy moment of the machine cannot favour one layout. Each is repeated for
    ~10 ms per turn; CPU seconds of this thread, best of S.rounds."""
    q, k, v, _ = tensors(S)
    jobs = {}
    for layout in LAYOUTS:
        blocks = pieces(layout)
        for r in range(c):
            pos = positions(S.seq, c, r, layout)
            ring = [(k[..., kp, :], v[..., kp, :], kp)  # the key/value blocks in the order the ring brings them
                    for kp in (positions(S.seq, c, (r - j) % c, layout) for j in range(c))]

            def forward(ql=q[..., pos, :], pos=pos, ring=ring, blocks=blocks):
                acc = [None] * blocks
                for kb, vb, kp in ring:
                    acc = attend(ql, pos, blocks, kb, vb, kp, acc)
            jobs[("work", layout, r)] = forward
    for n in (S.seq // c, S.seq // (2 * c)):  # contiguous blocks, zig-zag blocks
        # one pair of blocks through the ring's own step (slicing and all), as the ranks' work runs it
        qb, kb, vb = q[..., :n, :], k[..., :n, :], v[..., :n, :]
        here, before = torch.arange(n, 2 * n), torch.arange(n)
        o, lse = block_attention(qb, kb, vb, here, before)
        jobs[("whole", n)] = lambda qb=qb, kb=kb, vb=vb, here=here, before=before: attend(qb, here, 1, kb, vb, before,
                                                                                          [None])
        jobs[("masked", n)] = lambda qb=qb, kb=kb, vb=vb, before=before: attend(qb, before, 1, kb, vb, before, [None])
        jobs[("skipped", n)] = lambda qb=qb, kb=kb, vb=vb, here=here, before=before: attend(qb, before, 1, kb, vb,
                                                                                            here, [None])
        jobs[("merge", n)] = lambda o=o, lse=lse: merge(o, lse, o, lse)
    best = dict.fromkeys(jobs, math.inf)
    with torch.no_grad(), one_thread():
        reps = {key: _reps(fn) for key, fn in jobs.items()}
        for _ in range(S.rounds):
            for key, fn in jobs.items():
                t0 = time.thread_time()
                for _ in range(reps[key]):
                    fn()
                best[key] = min(best[key], (time.thread_time() - t0) / reps[key])
    lengths = (S.seq // c, S.seq // (2 * c))
    return Timings(times={layout: [best[("work", layout, r)] for r in range(c)] for layout in LAYOUTS},
                   block_costs=BlockCosts(**{kind: {n: best[(kind, n)] for n in lengths}
                                             for kind in ("whole", "masked", "skipped", "merge")}))


@dataclass(frozen=True)
class LayoutRun:
    """One layout's ring attention on this rank: one forward and backward."""
    positions: list[int]   # the sequence positions this rank holds
    max_diff: float        # largest |difference| of the output and the q, k, v gradients from one process's
    bytes: int             # bytes this rank sent, counted at the sends
    sends: int             # blocks this rank passed on, forward and backward
    wire: int | None       # bytes on the loopback interface, all ranks' (None where it cannot be read)
    scores: int            # score entries this rank computed
    saved: int             # bytes this rank keeps for backward beyond q, k, v


@dataclass(frozen=True)
class RingRun:
    """One rank's ring attention in each layout, and torch's context_parallel tried."""
    layouts: dict[SeqLayout, LayoutRun]
    torch_cp: TorchCP


def lesson_run(S: Settings) -> RingRun:
    """For each layout: parity with one process (output and gradients), bytes counted and on the wire for one
    forward and backward, score entries, the forward's work timed rank by rank, bytes kept for backward; then
    torch's context_parallel, tried."""
    c, r = world_size(), rank()
    ref = reference(S)
    layouts = {}
    total, done = len(LAYOUTS), 0
    for layout in LAYOUTS:
        pos = positions(S.seq, c, r, layout)
        counter: dict = {}
        with WireBytes() as wire:
            got = _ring(S, layout, counter)
        diff = max((got[key] - ref[key][..., pos, :]).abs().max().item() for key in got)
        q, k, v, _ = tensors(S)
        ql, kl, vl = (t[..., pos, :].clone().requires_grad_() for t in (q, k, v))
        saved, _ = saved_activations(lambda: ring_attention(ql, kl, vl, pos, blocks=pieces(layout)),
                                     exclude=[ql, kl, vl])
        done += 1
        report_progress(done, total, layout)
        layouts[layout] = LayoutRun(positions=pos.tolist(), max_diff=diff, bytes=counter["bytes"],
                                    sends=counter["sends"], wire=wire.bytes, scores=counter["scores"],
                                    saved=sum(t.nbytes for t in saved))
    return RingRun(layouts=layouts, torch_cp=_torch_cp(S, ref))


def one_process_saved(S: Settings) -> int:
    """Bytes one process's written-out attention keeps for backward over the whole sequence (beyond q, k, v)."""
    q, k, v, _ = tensors(S)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    pos = torch.arange(S.seq)
    saved, _ = saved_activations(lambda: block_attention(q, k, v, pos, pos), exclude=[q, k, v])
    return sum(t.nbytes for t in saved)


# --- your merge, inside ring attention on real ranks (the exercise of section 1) --------------------------------


@dataclass(frozen=True, kw_only=True)
class MergeJob(Settings):
    """The lesson's settings and a learner's merge, sent as source."""
    source: str = ""
    name: str = "my_merge"


@dataclass(frozen=True)
class MergeCheck:
    """The learner's merge inside ring attention on this rank: how far from one process, or where it failed."""
    difference: float | None = None   # largest |difference| of the output and gradients, both layouts
    error: str | None = None          # where the learner's code failed (then no difference)
    output_difference: float | None = None  # ... of the output alone


def merge_on_ranks(job: MergeJob) -> MergeCheck:
    """Ring attention with the learner's merge, both layouts, against one process: the largest difference of the
    output and the gradients on this rank, or where the learner's code failed (an endless loop included: it may take
    a multiple of the lab's merge's time in the same ring, timed just before)."""
    try:
        fn = load_function(job.source, job.name, {"torch": torch})
    except Exception as e:  # noqa: BLE001 - the learner's cell does not compile: say so, on every rank alike
        return MergeCheck(error=where_it_failed(e, f"<your {job.name}>", job.source))
    ref, worst, worst_out = reference(job), 0.0, 0.0
    for layout in LAYOUTS:
        q, k, v, R = tensors(job)
        pos = positions(job.seq, world_size(), rank(), layout)
        start = time.perf_counter()
        ring_attention(q[..., pos, :], k[..., pos, :], v[..., pos, :], pos, blocks=pieces(layout))  # the lab's merge
        bound = bound_for(time.perf_counter() - start)
        ql, kl, vl = (t[..., pos, :].clone().requires_grad_() for t in (q, k, v))
        try:
            with time_bound(bound):
                out = ring_attention(ql, kl, vl, pos, blocks=pieces(layout), merge_fn=fn)
                (out * R[..., pos, :]).sum().backward()
        except LEARNER_ERRORS as e:  # every rank runs the same code on the same shapes: all fail alike
            return MergeCheck(error=f"rank {rank()}: {where_it_failed(e, f'<your {job.name}>', job.source)}")
        got = {"out": out.detach(), "q": ql.grad, "k": kl.grad, "v": vl.grad}
        lost = torch.tensor([float(got[key] is None) for key in ("q", "k", "v")])
        dist.all_reduce(lost, op=dist.ReduceOp.MAX)  # every rank stops here alike, or none does
        if lost.any():  # the gradients flow through the merge: on some rank none reached these
            names = ", ".join(key for key, x in zip("qkv", lost.tolist()) if x)
            return MergeCheck(error=f"no gradient reached {names} through your merge: its output is cut from "
                                    "autograd (torch.no_grad(), .detach() or .item() inside it)")
        worst = max([worst] + [(got[key] - ref[key][..., pos, :]).abs().max().item() for key in got])
        worst_out = max(worst_out, (got["out"] - ref["out"][..., pos, :]).abs().max().item())
    return MergeCheck(difference=worst, output_difference=worst_out)
