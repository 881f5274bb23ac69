"""Lesson 07, the component exercise: data parallelism written out as DDP does it — rank 0's weights broadcast, the
gradients cut into buckets in the order backward produces them, each bucket's all-reduce started from a hook the
moment its last gradient is ready (so that it overlaps the rest of backward), and averaged at the end. Checked on
real ranks against torch's DistributedDataParallel at the same bucket size: its buckets, its gradients, and when the
all-reduces ran."""

import inspect
import re
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.config import build_gpt, global_batch
from labtools.exercises import NOT_WRITTEN, Outcome, failed, launch_yours
from labtools.learner import LEARNER_ERRORS, bound_for, is_stub, load_function, source_of, time_bound, where_it_failed
from labtools.parallel.comm import DDPCommCounter
from labtools.parallel.toolkit import rank, world_size
from lessons.data_parallel import Settings

WORLD = 2
CAPS_MB = (0.05, 0.25)       # bucket sizes to try: many buckets, then two
TOL = 1e-6                   # relative: the same sums, in buckets as DDP's
LAUNCH_TIMEOUT_S = 90        # the whole launch, a backstop for what the per-call bound cannot stop


@dataclass(frozen=True)
class DDPJob:
    """The learner's class, sent as source, and the lesson's settings (its model and batch)."""
    settings: Settings
    source: str = ""
    name: str = "MyDDP"


@dataclass(frozen=True)
class DDPCase:
    """One bucket size on one rank: yours against torch's DDP."""
    case: str
    buckets: list[int] | None = None        # your buckets' bytes, in the order you made them
    ddp_buckets: list[int] | None = None    # DDP's, after it rebuilt them in backward's order
    difference: float | None = None         # max relative |your gradient − DDP's|, over two steps
    summed: bool = False                    # yours are DDP's times the number of ranks: a sum, not a mean
    calls: int = 0                          # all-reduces you started in one step
    during_backward: int = 0                # ... of them, before backward returned
    blocking: int = 0                       # ... of those, without async_op=True: backward waited for each
    same_weights: bool = True               # after wrapping, this rank held rank 0's weights
    error: str = ""


@dataclass(frozen=True)
class DDPExerciseResult:
    cases: list[DDPCase]


class _CountingDist:
    """torch.distributed for the learner's class, its all_reduce counted (calls, and which were started while
    backward ran)."""

    def __init__(self):
        self.calls, self.in_backward, self.during_backward, self.blocking = 0, False, 0, 0

    def all_reduce(self, tensor, *args, **kwargs):
        self.calls += 1
        self.during_backward += self.in_backward
        self.blocking += self.in_backward and not kwargs.get("async_op", args[2] if len(args) > 2 else False)
        return dist.all_reduce(tensor, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(dist, name)


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b))


def ddp_exercise(job: DDPJob) -> DDPExerciseResult:
    """On every rank: for each bucket size, DDP and the learner's class from different initial weights on each rank
    (rank 0's must win), two steps of backward on this rank's rows; report buckets, gradients and all-reduces."""
    S, r, n = job.settings, rank(), world_size()
    counting = _CountingDist()
    try:
        cls = load_function(job.source, job.name, {"torch": torch, "dist": counting})
    except Exception as e:  # noqa: BLE001 - the learner's cell does not compile: said on every rank alike
        return DDPExerciseResult([DDPCase("your cell", error=where_it_failed(e, f"<your {job.name}>"))])
    X, Y = global_batch(S, torch.Generator().manual_seed(S.seed), n * S.batch_size)
    rows = slice(r * S.batch_size, (r + 1) * S.batch_size)
    cases = []
    for cap in CAPS_MB:
        case = DDPCase(f"bucket_bytes = {int(cap * 2**20):,} on {n} ranks")
        counter = DDPCommCounter()
        start = time.perf_counter()
        theirs = DDP(build_gpt(S), bucket_cap_mb=cap)
        theirs.register_comm_hook(None, counter.hook)
        torch_grads = []
        for _ in range(2):  # DDP rebuilds its buckets in backward's order after the first: compare the second too
            counter.reset()
            theirs(X[rows], Y[rows])[1].backward()
            torch_grads.append([p.grad.clone() for p in theirs.parameters()])
            theirs.zero_grad(set_to_none=True)
        bound = bound_for(time.perf_counter() - start)
        where = f"<your {job.name}>"
        try:
            with time_bound(bound):
                model = build_gpt(replace(S, seed=S.seed + r))  # each rank starts elsewhere: rank 0's must win
                mine = cls(model, int(cap * 2**20))
                same = all(torch.equal(p, q) for p, q in zip(model.parameters(), theirs.module.parameters()))
                buckets = [sum(p.numel() * p.element_size() for p in b) for b in mine.buckets]
                grads = []
                for _ in range(2):
                    counting.calls = counting.during_backward = counting.blocking = 0
                    counting.in_backward = True
                    mine(X[rows], Y[rows])[1].backward()
                    counting.in_backward = False
                    mine.finish()
                    grads.append([p.grad.clone() if p.grad is not None else torch.full_like(p, float("nan"))
                                  for p in model.parameters()])
                    model.zero_grad(set_to_none=True)
        except LEARNER_ERRORS as e:
            cases.append(replace(case, error=f"rank {r}: {where_it_failed(e, where, job.source)}"))
            break
        difference = max(_relative(g, t) for g, t in zip(grads, torch_grads))
        summed = max(_relative([x / n for x in g], t) for g, t in zip(grads, torch_grads)) <= TOL
        cases.append(replace(case, buckets=buckets, ddp_buckets=counter.bucket_bytes, difference=difference,
                             summed=summed, calls=counting.calls, during_backward=counting.during_backward,
                             blocking=counting.blocking, same_weights=same))
    return DDPExerciseResult(cases)


def check(fn, S: Settings) -> Outcome:
    """Your class on WORLD gloo ranks against DistributedDataParallel at two bucket sizes: the same buckets, the same
    gradients over two steps (to a relative 1e-6), and one all-reduce per bucket, each started during backward."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    try:
        source = source_of(fn)
    except ValueError as e:
        return Outcome("fail", str(e))
    job = DDPJob(S, source, fn.__name__)
    res = launch_yours(ddp_exercise, WORLD, job, desc="your DDP", timeout_s=LAUNCH_TIMEOUT_S,
                       hint="every rank must start the same all-reduces, in the same order")
    if isinstance(res, Outcome):
        return res
    for i, case in enumerate(res[0].cases):
        mine = [r.cases[i] for r in res if i < len(r.cases)]
        error = next((c.error for c in mine if c.error), "")
        if error:
            return failed(case.case, error)
        if case.buckets != case.ddp_buckets:
            return failed(case.case, f"your buckets hold {_sizes(case.buckets)} bytes, DDP's {_sizes(case.ddp_buckets)}",
                          "take the parameters last to first (the order backward finishes them) and close a bucket "
                          "as soon as it holds at least bucket_bytes")
        worst = max(c.difference for c in mine)
        if not worst <= TOL:
            hint = ("each rank must end with the mean of the ranks' gradients: the all-reduce gives their sum" if
                    all(c.summed for c in mine) else "every rank must start from rank 0's weights: broadcast them "
                    "when the model is wrapped, or each rank computes gradients of a different model"
                    if not all(c.same_weights for c in mine) else "the all-reduce works on the flat copy of a "
                    "bucket: after waiting for it, put the mean back into every p.grad")
            return failed(case.case, f"your gradients differ from DDP's by a relative {worst:.1e} (allowed "
                                     f"{TOL:.0e})", hint)
        if case.calls != len(case.ddp_buckets):
            return failed(case.case, f"you started {case.calls} all-reduces in a step for "
                                     f"{len(case.ddp_buckets)} buckets", "one all-reduce per bucket, per step")
        if case.during_backward < case.calls:
            return failed(case.case, f"{case.calls - case.during_backward} of your {case.calls} all-reduces started "
                                     "after backward had finished", "start a bucket's all-reduce from a gradient hook "
                                     "the moment its last gradient is ready, so that it overlaps the rest of backward")
        if case.blocking:
            return failed(case.case, f"{case.blocking} of your {case.calls} all-reduces made backward wait until "
                                     "each had finished", "start each with async_op=True and wait for the work it "
                                     "returns in finish(): only then does communication overlap the rest of backward")
    counts = ", ".join(str(len(c.ddp_buckets)) for c in res[0].cases)
    return Outcome("pass", f"your DDP matches DistributedDataParallel on {WORLD} ranks at {len(CAPS_MB)} bucket sizes "
                           f"({counts} buckets): the same buckets, the same gradients (largest relative difference "
                           f"{max(c.difference for r in res for c in r.cases):.1e}), each all-reduce started during "
                           "backward", 0.0)


def _sizes(sizes: list[int] | None) -> str:
    return "none" if not sizes else f"{len(sizes)} buckets of " + ", ".join(f"{s:,}" for s in sizes[:6]) + \
        (", …" if len(sizes) > 6 else "")


class Reference:
    """Data parallelism as DDP does it: broadcast, buckets, hooks, and an average at the end."""

    def __init__(self, model, bucket_bytes):
        self.model = model
        for p in model.parameters():                      # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)  # noqa: F821 - the ranks provide dist
        self.buckets, bucket, size = [], [], 0
        for p in reversed(list(model.parameters())):      # backward finishes the last layers first
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:                      # closed once it holds at least bucket_bytes
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.pending, self.works = [len(b) for b in self.buckets], []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        """Called by autograd once p.grad holds this backward's gradient."""
        i = self.bucket_of[p]
        self.pending[i] -= 1
        if self.pending[i] == 0:                          # the bucket's last gradient: send it now
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
            self.works.append((i, flat, dist.all_reduce(flat, async_op=True)))  # noqa: F821

    def __call__(self, *args):
        return self.model(*args)

    def finish(self):
        """After backward: wait for every bucket, and put the mean back into each gradient."""
        n = dist.get_world_size()  # noqa: F821
        for i, flat, work in self.works:
            work.wait()
            for p, g in zip(self.buckets[i], flat.div(n).split([q.numel() for q in self.buckets[i]])):
                p.grad.copy_(g.view_as(p))
        self.pending, self.works = [len(b) for b in self.buckets], []


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return re.sub(r"  # noqa.*", "", inspect.getsource(Reference)).replace("class Reference:", "class MyDDP:")
