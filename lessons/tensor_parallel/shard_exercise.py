"""Lesson 10, your turn: split an MLP for tensor parallelism, checked two ways: each rank's shards are the ones the
lab's ColumnParallelLinear / RowParallelLinear (and DTensor's ColwiseParallel / RowwiseParallel, Shard(0) and
Shard(1)) hold, and the tp ranks' partial outputs add up to the unsplit MLP's output (the all-reduce
of Megatron's reduce, its g)."""

import inspect

import torch
import torch.nn.functional as F

from labtools.exercises import (YOURS_NOT_WRITTEN, Outcome, YourRun, attempt, compare_runs, difference, failed,
                                launch_yours, losses_history, outcome)
from labtools.learner import is_stub, source_of
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.launches import LessonRuns
from lessons.tensor_parallel.shard_ranks import ShardJob, train_with_shards

HINT = ("c_fc is column-parallel: rank r keeps rows r·4h/tp … (r+1)·4h/tp of its weight (out × in) and the same slice "
        "of its bias; c_proj is row-parallel: rank r keeps the same range of its weight's columns")


def reference(W_fc, b_fc, W_proj, tp, r):
    """Rank r's shards of an MLP y = gelu(x W_fcᵀ + b_fc) W_projᵀ + b_proj split tp ways: (W_fc_r, b_fc_r, W_proj_r)."""
    n = W_fc.shape[0] // tp                # hidden units per rank (4h / tp)
    rows = slice(r * n, (r + 1) * n)
    return W_fc[rows], b_fc[rows], W_proj[:, rows]  # column-parallel c_fc; row-parallel c_proj (its bias: added once)


def _mlp(h: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    W_fc, b_fc = torch.randn(4 * h, h, generator=g) / h**0.5, torch.randn(4 * h, generator=g)
    W_proj, b_proj = torch.randn(h, 4 * h, generator=g) / (2 * h**0.5), torch.randn(h, generator=g)
    x = torch.randn(3, 5, h, generator=g)
    return x, W_fc, b_fc, W_proj, b_proj


def check_shards(fn) -> Outcome:
    """Your shards for tp = 2 and 4 (every rank), then the sum of the tp partial outputs against the unsplit MLP."""
    results = []
    for h, tp in ((8, 2), (16, 4)):
        x, W_fc, b_fc, W_proj, b_proj = _mlp(h, seed=tp)
        full = F.gelu(x @ W_fc.T + b_fc) @ W_proj.T + b_proj
        partial_sum = torch.zeros_like(full)
        name = f"h = {h} split over tp = {tp} ranks"
        for r in range(tp):
            case = f"{name}, rank {r}"
            tried = attempt(fn, W_fc.clone(), b_fc.clone(), W_proj.clone(), tp, r, case=case, hint=HINT)
            if not tried.returned:
                return tried.outcome
            got = tried.value
            expected = reference(W_fc, b_fc, W_proj, tp, r)
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                return failed(case, "return three tensors: (W_fc_r, b_fc_r, W_proj_r)")
            for part, g_, e_ in zip(("W_fc", "b_fc", "W_proj"), got, expected):
                if difference(g_, e_) > 0:
                    if isinstance(g_, torch.Tensor) and g_.shape == e_.shape:
                        return failed(case, f"your {part} shard has the right shape, {tuple(e_.shape)}, but other "
                                            f"numbers than the ones rank {r} holds", "each rank keeps one contiguous "
                                            "block: rank r's hidden units are r·4h/tp … (r+1)·4h/tp, in order")
                    shape = tuple(g_.shape) if isinstance(g_, torch.Tensor) else type(g_).__name__
                    return failed(case, f"your {part} shard (shape {shape}) is not the one rank {r} holds (shape "
                                        f"{tuple(e_.shape)})", HINT)
            W1, b1, W2 = got
            partial_sum += F.gelu(x @ W1.T + b1) @ W2.T  # what rank r computes; reduce sums them
        results.append({"case": name, "difference": difference(partial_sum + b_proj, full)})
    return outcome(results, tol=1e-5, what="your shards are the ones each rank holds, and the sum of their partial "
                   "outputs", reference="the unsplit MLP's output")


TRAIN_TOL = 1e-4       # nats: the same sums, split by hidden unit, to rounding
TRAIN_TIMEOUT_S = 120  # the whole launch; a rank left waiting ends sooner, at the collective timeout
TRAIN_TP = 2


def train_with_yours(fn, S: Settings, res: LessonRuns) -> YourRun:
    """The GPT trained on two real ranks with every block's MLP split by your function, against the same steps in
    one process (section 5's reference). Your shards must first pass their check."""
    lab = losses_history(res.single.losses)
    if is_stub(fn):
        return YourRun(Outcome("not written", YOURS_NOT_WRITTEN), lab)
    checked = check_shards(fn)
    if not checked.passed:
        return YourRun(Outcome("fail", f"make the check above pass first: {checked.message}"), lab)
    ran = launch_yours(train_with_shards, TRAIN_TP, ShardJob(S, source_of(fn)),
                       desc=f"your MLP shards × {TRAIN_TP}", timeout_s=TRAIN_TIMEOUT_S, hint=HINT)
    if isinstance(ran, Outcome):
        return YourRun(ran, lab)
    if ran[0].error:
        return YourRun(Outcome("fail", f"the run with your shards stopped: {ran[0].error}"), lab)
    return compare_runs(losses_history(ran[0].losses), lab, what=f"your MLP shards, on {TRAIN_TP} ranks,",
                        tol=TRAIN_TOL)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_mlp_shards(")
