"""Lesson 06, your turn: bytes per parameter on one GPU under a ZeRO stage, checked against labtools.budget.estimate
(whose model states section 3 checks against real models' tensors)."""

import inspect


from labtools.budget import estimate
from labtools.exercises import Case, Outcome, check


def calculator(stage: int, N: int) -> float:
    """The reference: labtools.budget.estimate for bf16 mixed-precision AdamW, bytes per parameter per GPU."""
    return estimate(10**9, zero_stage=stage, dp=N).bytes_per_param()


CASES = [
    Case("no ZeRO, 8 GPUs", (0, 8), hint="stage 0 shards nothing: 2 + 2 + 4 + 8 bytes on every GPU"),
    Case("ZeRO-1, 8 GPUs", (1, 8), hint="stage 1 shards the fp32 master copy and Adam's two moments (12 bytes) over N"),
    Case("ZeRO-2, 8 GPUs", (2, 8), hint="stage 2 shards the gradients (2 bytes) too"),
    Case("ZeRO-3, 8 GPUs", (3, 8), hint="stage 3 shards everything, the bf16 weights included: 16 / N"),
    Case("ZeRO-3, one GPU", (3, 1), hint="with N = 1 there is nothing to shard over: every stage is 16"),
    Case("ZeRO-1, 64 GPUs", (1, 64), hint="the unsharded 2 + 2 stay whole on every GPU, however large N is"),
]


def reference(stage, N):
    """Bytes per parameter on one GPU: bf16 weights 2, bf16 gradients 2, fp32 master 4, Adam's m and v 8."""
    weights, grads, fp32_states = 2, 2, 4 + 8
    if stage >= 1:
        fp32_states /= N   # ZeRO-1: the optimizer's states (master copy, m, v) are sharded
    if stage >= 2:
        grads /= N         # ZeRO-2: and the gradients
    if stage >= 3:
        weights /= N       # ZeRO-3: and the weights
    return weights + grads + fp32_states


def check_zero(fn) -> Outcome:
    """Your bytes per parameter against the lab's calculator, six stages × GPU counts."""
    return check(fn, calculator, CASES, tol=1e-9, what="your bytes per parameter", unit="bytes per parameter",
                 against="the lab's calculator")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_bytes_per_param(")
