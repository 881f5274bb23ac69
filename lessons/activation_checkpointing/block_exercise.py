"""Lesson 05, your turn: predict the bytes one transformer block keeps for backward, with and without
checkpointing, checked against the bytes autograd really saves (saved_tensors_hooks, on the CPU in fp32)."""

import inspect

import torch

from labtools.config import LabConfig, build_gpt
from labtools.exercises import Outcome, attempt, failed, outcome
from labtools.memory import saved_activation_bytes
from lessons.activation_checkpointing import VOCAB

HEADS = 4
TOL = 0.02  # the per-row fp32 statistics of the LayerNorms and of attention, left out of the prediction: < 1% here
# (name, b, s, h, policy, hint shown if this case fails)
CASES = [
    ("no checkpointing", 2, 16, 64, "none", "add the table's units: 16 tensors of b·s·h elements, 4 bytes each"),
    ("no checkpointing, a larger shape", 4, 32, 128, "none", "the bytes grow with b, s and h: all three multiply"),
    ("checkpoint the block", 2, 16, 64, "block", "a checkpointed block keeps only its input: one b·s·h tensor"),
    ("checkpoint attention", 2, 16, 64, "attn",
     "the attention half keeps only its input x (1 unit) instead of 6; the MLP half keeps what it did"),
    ("checkpoint the MLP", 2, 16, 64, "mlp",
     "the MLP half keeps only its input (1 unit) instead of 10; the attention half keeps what it did"),
]


def measured_block_bytes(b: int, s: int, h: int, policy: str) -> int:
    """Bytes one block saves for backward, measured: a two-block GPT's saved bytes minus a one-block GPT's (the
    embedding, head and loss are the same in both)."""
    X = torch.randint(VOCAB, (b, s), generator=torch.Generator().manual_seed(0))
    saved = {}
    for n_layer in (1, 2):
        shape = LabConfig(n_layer=n_layer, n_embd=h, n_head=HEADS, block_size=s)
        model = build_gpt(shape, VOCAB, device="cpu", checkpoint=policy)
        saved[n_layer] = saved_activation_bytes(model, X, X)
    return saved[2] - saved[1]


def reference(b, s, h, policy):
    """Bytes one block keeps for backward in fp32, in units of one b·s·h tensor (statistics left out)."""
    units = {"none": 16,     # 6 in the attention half (ln_1, c_attn, q k v, its output) + 10 in the MLP half
             "attn": 1 + 10,  # the attention half keeps only its input
             "mlp": 6 + 1,    # the MLP half keeps only its input
             "block": 1}[policy]
    return units * b * s * h * 4


def check_bytes(fn) -> Outcome:
    """Your prediction against the bytes autograd saves, five shapes and policies, within 2% (the statistics)."""
    results = []
    for name, b, s, h, policy, hint in CASES:
        tried = attempt(fn, b, s, h, policy, case=name, hint=hint)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        measured = measured_block_bytes(b, s, h, policy)
        if not isinstance(got, (int, float)):
            return failed(name, f"return a number of bytes, got {type(got).__name__}")
        off = abs(got - measured) / measured
        results.append({"case": name, "difference": off, "hint": f"{hint} (you said {got:,.0f} bytes, autograd "
                        f"kept {measured:,})" if off > TOL else hint})
        if not off <= TOL:
            break  # the first case off is the verdict
    return outcome(results, tol=TOL, what="your prediction", reference="the bytes autograd saved", relative=True)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_block_bytes(")
