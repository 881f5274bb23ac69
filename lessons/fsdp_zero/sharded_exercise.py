"""Lesson 08, the component exercise: a ZeRO-style sharded AdamW written out. The parameters are seen as one flat
vector cut into N equal shards; each rank keeps AdamW's two moments for its own shard only, gets its shard's mean
gradient with a reduce-scatter, updates its shard, and all-gathers the shards back into the model. Checked on real
ranks against torch's AdamW on gradients averaged by dist.all_reduce (DDP's arithmetic): the same weights and the
same moments after several steps, and each rank's state 1/N of the whole."""

import inspect
import math
import re
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from labtools.config import build_gpt
from labtools.exercises import NOT_WRITTEN, Outcome, failed, launch_yours
from labtools.learner import LEARNER_ERRORS, bound_for, is_stub, load_function, source_of, time_bound, where_it_failed
from labtools.parallel.toolkit import rank, world_size
from lessons.fsdp_zero import Settings

WORLD = 2
STEPS = 3
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
TOL = 1e-5          # the moments, relative to their largest entry: AdamW's arithmetic in another order
STEP_TOL = 1e-3     # the weights, in learning rates
LAUNCH_TIMEOUT_S = 90


@dataclass(frozen=True)
class ShardedJob:
    settings: Settings
    source: str = ""
    name: str = "MyShardedAdamW"


@dataclass(frozen=True)
class ShardedCase:
    """One rank's verdict: its weights and moments against the reference's, and the bytes of state it kept."""
    case: str
    weights: float | None = None     # max |yours − reference| ÷ lr, after STEPS steps
    own_weights: float | None = None  # the same over this rank's own shard only
    moments: float | None = None     # the same for your shard of exp_avg and exp_avg_sq (your shard of the flat vector)
    moments_summed: bool = False     # yours are the reference's with gradients summed, not averaged
    state_bytes: int | None = None   # the bytes of the tensors in your self.state
    shard_bytes: int | None = None   # what two fp32 moments of one shard take: 2 · 4 · ⌈P / N⌉
    error: str = ""


@dataclass(frozen=True)
class ShardedResult:
    cases: list[ShardedCase]


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def gradients(params: list[torch.Tensor], r: int, t: int) -> list[torch.Tensor]:
    """Rank r's gradients at step t: fixed numbers, not a backward's, so that the weights do not feed back into
    them and only the optimizers can differ (a rounding difference in one step would otherwise grow in the next)."""
    g = torch.Generator().manual_seed(1000 * r + t)
    return [1e-2 * torch.randn(p.shape, generator=g) for p in params]


class _ReduceScatterOnly:
    """torch.distributed for the learner's class, without all_reduce: ZeRO's gradient step is a reduce-scatter."""

    def all_reduce(self, *args, **kwargs):
        raise RuntimeError("all_reduce is not allowed here: it hands every rank every shard's sum, twice the bytes "
                           "of a reduce-scatter, which hands each rank its own shard only")

    def __getattr__(self, name):
        return getattr(dist, name)


def _params(model) -> list[torch.Tensor]:
    """The model's parameters and a 3-number one: an odd total, so that the last shard needs padding on two ranks."""
    return list(model.parameters()) + [torch.nn.Parameter(torch.zeros(3))]


def sharded_exercise(job: ShardedJob) -> ShardedResult:
    """On every rank: the reference (all-reduced gradients, torch's AdamW on everything) and the learner's class
    (each rank starting from the same weights), STEPS steps on this rank's gradients; compare weights, this rank's
    shard of the moments, and the state it kept."""
    S, r, n = job.settings, rank(), world_size()
    case = ShardedCase(f"{STEPS} steps on {n} ranks")
    try:
        cls = load_function(job.source, job.name, {"torch": torch, "dist": _ReduceScatterOnly(), "math": math})
    except Exception as e:  # noqa: BLE001 - the learner's cell does not compile: said on every rank alike
        return ShardedResult([replace(case, case="your cell", error=where_it_failed(e, f"<your {job.name}>"))])
    start = time.perf_counter()
    reference = _params(build_gpt(S))
    adamw = torch.optim.AdamW(reference, **HYPER)
    for t in range(STEPS):
        for p, grad in zip(reference, gradients(reference, r, t)):
            dist.all_reduce(grad)
            p.grad = grad / n
        adamw.step()
        adamw.zero_grad(set_to_none=True)
    bound = bound_for(time.perf_counter() - start)
    P = sum(p.numel() for p in reference)
    shard = math.ceil(P / n)
    moments = [_flat(adamw.state[p][k] for p in reference) for k in ("exp_avg", "exp_avg_sq")]
    lo, hi = r * shard, min((r + 1) * shard, P)

    model = _params(build_gpt(S))
    try:
        with time_bound(bound):
            mine = cls(model, **HYPER)
            for t in range(STEPS):
                for p, grad in zip(model, gradients(model, r, t)):
                    p.grad = grad
                mine.step()
                mine.zero_grad()
            state = dict(getattr(mine, "state", {}) or {})
    except LEARNER_ERRORS as e:
        return ShardedResult([replace(case, error=f"rank {r}: {where_it_failed(e, f'<your {job.name}>', job.source)}")])
    kept = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    gap = (_flat(model) - _flat(reference)).abs() / HYPER["lr"]
    weights, own = gap.max().item(), gap[lo:hi].max().item() if hi > lo else 0.0
    theirs = [state.get(k) for k in ("exp_avg", "exp_avg_sq")]
    if all(isinstance(t, torch.Tensor) and t.numel() >= hi - lo for t in theirs):
        got = [t.reshape(-1)[:hi - lo].float() for t in theirs]
        want = [m[lo:hi] for m in moments]
        moment_gap = max(_relative(a, b) for a, b in zip(got, want))
        summed = max(_relative(a, b * s) for a, b, s in zip(got, want, (n, n * n))) <= TOL
    else:
        moment_gap, summed = math.inf, False
    return ShardedResult([replace(case, weights=weights, own_weights=own, moments=moment_gap, moments_summed=summed, state_bytes=kept,
                                  shard_bytes=2 * 4 * shard)])


def check(fn, S: Settings) -> Outcome:
    """Your class on WORLD gloo ranks, STEPS steps, against torch's AdamW on all-reduced gradients: your shard of the
    moments to a relative 1e-5, the weights to a hundredth of a learning rate, and your state two fp32 tensors of one
    shard, not of the whole."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    try:
        job = ShardedJob(S, source_of(fn), fn.__name__)
    except ValueError as e:
        return Outcome("fail", str(e))
    res = launch_yours(sharded_exercise, WORLD, job, desc="your sharded AdamW", timeout_s=LAUNCH_TIMEOUT_S,
                       hint="every rank must make the same collective calls, in the same order")
    if isinstance(res, Outcome):
        return res
    cases = [c for r in res for c in r.cases]
    name = cases[0].case
    error = next((c.error for c in cases if c.error), "")
    if error:
        return failed(name, error)
    worst = max(c.moments for c in cases)
    if not worst <= TOL:
        if all(c.moments_summed for c in cases):
            hint = "the reduce-scatter sums the ranks' gradients: divide by N for their mean"
        elif math.isinf(worst):
            hint = ("keep your shard's moments in self.state['exp_avg'] and self.state['exp_avg_sq'], each a tensor "
                    "of ⌈P / N⌉ numbers, in the order of the flat vector")
        else:
            hint = ("rank r's shard is numbers r·⌈P/N⌉ to (r+1)·⌈P/N⌉ of the parameters flattened in order (padded "
                    "with zeros at the end); its moments follow AdamW: m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g²")
        return failed(name, f"your moments differ from torch's AdamW by a relative {worst:.1e} (allowed {TOL:.0e})",
                      hint)
    worst = max(c.weights for c in cases)
    if not worst <= STEP_TOL:
        if math.isnan(worst):
            hint = ("bias correction divides by 1 − β^t, which is 0 at t = 0: count the step, from 1, before you use "
                    "it")
        elif all(c.own_weights <= STEP_TOL for c in cases):
            hint = "each rank updated its own shard, but the others never saw it: all-gather the shards after the update"
        elif max(c.own_weights for c in cases) > 10:
            hint = ("a rank's shard of the weights must be the same numbers as its shard of the gradient: r·⌈P/N⌉ to "
                    "(r+1)·⌈P/N⌉ of the flat vector")
        else:
            hint = ("your moments are right, so the update is not: bias-correct both moments, m̂ = m/(1 − β1^t) and "
                    "v̂ = v/(1 − β2^t), put ε outside the root, and decay the weights themselves, "
                    "θ ← θ·(1 − lr·λ) − lr·m̂ / (√v̂ + ε)")
        return failed(name, f"your weights differ from torch's AdamW by {worst:.2g} learning rates (allowed "
                            f"{STEP_TOL:g})", hint)
    fat = [c for c in cases if c.state_bytes > c.shard_bytes]
    if fat:
        c = fat[0]
        return failed(name, f"a rank kept {c.state_bytes:,} bytes of state where one shard's two fp32 moments take "
                            f"{c.shard_bytes:,}", "ZeRO's saving is that each rank keeps the moments of its own shard "
                                                  "only")
    c = cases[0]
    return Outcome("pass", f"your sharded AdamW matches torch's on {WORLD} ranks after {STEPS} steps (weights and "
                           f"moments), each rank keeping {c.state_bytes:,} bytes of state: 1/{WORLD} of the "
                           f"{WORLD * c.shard_bytes:,} an unsharded AdamW keeps", 0.0)


class Reference:
    """AdamW with its moments sharded across the ranks (ZeRO stage 1, on one flat vector)."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.n, self.r = dist.get_world_size(), dist.get_rank()
        total = sum(p.numel() for p in params)
        self.shard = math.ceil(total / self.n)                 # numbers per rank; the flat vector is padded
        self.pad = self.shard * self.n - total
        self.state = {"exp_avg": torch.zeros(self.shard), "exp_avg_sq": torch.zeros(self.shard)}
        self.t = 0

    def _flat(self, tensors):
        return torch.cat([t.reshape(-1) for t in tensors] + [torch.zeros(self.pad)])

    def step(self):
        self.t += 1
        grad = torch.empty(self.shard)
        dist.reduce_scatter_tensor(grad, self._flat([p.grad for p in self.params]))  # my shard, summed
        grad /= self.n                                         # ... and averaged
        theta = self._flat([p.detach() for p in self.params])[self.r * self.shard:(self.r + 1) * self.shard]
        (b1, b2), m, v = self.betas, self.state["exp_avg"], self.state["exp_avg_sq"]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m_hat, v_hat = m / (1 - b1**self.t), v / (1 - b2**self.t)
        theta = theta * (1 - self.lr * self.wd) - self.lr * m_hat / (v_hat.sqrt() + self.eps)
        everything = torch.empty(self.shard * self.n)
        dist.all_gather_into_tensor(everything, theta)          # every rank's updated shard, on every rank
        with torch.no_grad():
            for p, new in zip(self.params, everything.split([p.numel() for p in self.params] + [self.pad])):
                p.copy_(new.view_as(p))

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return re.sub(r"  # noqa.*", "", inspect.getsource(Reference)).replace("class Reference:",
                                                                            "class MyShardedAdamW:")
