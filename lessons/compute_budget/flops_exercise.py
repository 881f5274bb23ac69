"""Lesson 12, your turn: the training FLOPs per token of the lab's GPT, checked against what torch's FlopCounterMode
counted for a real training step of each shape in section 1."""

import inspect

from labtools.exercises import NOT_WRITTEN, Outcome, attempt, failed, outcome
from labtools.learner import is_stub

HINT = ("four parts: 6 FLOPs per matrix weight per token (2 forward, 4 backward); 12·h² matrix weights per block "
        "(q, k, v and the output projection 4h², the MLP 8h²); the head, tied to the embedding, V·h weights that "
        "multiply; and attention's own products, 12·L·s·h")


def reference(L, h, V, s):
    """Training FLOPs per token of the lab's GPT: L blocks of width h, vocabulary V, sequence length s."""
    matrix_weights = 12 * L * h * h + V * h   # the blocks' linears, and the head (the embedding lookup is free)
    return 6 * matrix_weights + 12 * L * s * h  # 2 forward + 4 backward per weight; attention's scores and sum


def _misconception(got: float, L: int, h: int, V: int, s: int) -> str:
    """The typical mistake a wrong count matches, in words ("" if none does)."""
    weights, attention = 12 * L * h * h + V * h, 12 * L * s * h
    known = {
        "a forward pass only: training also runs backward, 4 FLOPs per weight per token beside forward's 2":
            2 * weights + attention / 3,
        "attention's products grow with s per token, not s²: each token's query meets s keys":
            6 * weights + 12 * L * s * s * h,
        "the embedding lookup multiplies nothing: only the head's V·h weights count, once":
            6 * (weights + V * h) + attention,
        "the MLP's 8h² are only part of a block: q, k, v and the output projection add 4h²":
            6 * (8 * L * h * h + V * h) + attention,
        "the count is of everything computed, the masked half of the scores included (as FLOP counters and MFU do)":
            6 * weights + attention / 2,
        "the head is a product too: V·h weights that multiply every token's activations":
            6 * 12 * L * h * h + attention,
    }
    return next((what for what, value in known.items() if abs(got / value - 1) < 1e-9), "")


def check_flops(fn, counts: list[dict]) -> Outcome:
    """Your formula against FlopCounterMode's count of a training step, for every shape section 1 counted."""
    if is_stub(fn):  # said before any case: with no counts, no case would call it
        return Outcome("not written", NOT_WRITTEN)
    results = []
    for r in counts:
        L, d, _, T = r["shape"]
        name = f"L = {L}, h = {d}, V = {r['vocab']}, s = {T}"
        tried = attempt(fn, L, d, r["vocab"], T, case=name, hint=HINT)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if not isinstance(got, (int, float)):
            return failed(name, f"return a number, got {type(got).__name__}")
        off = abs(got / r["train"] - 1)
        named = _misconception(got, L, d, r["vocab"], T)
        hint = f"{named or HINT} (you said {got:,.0f} FLOPs per token, the counter {r['train']:,.0f})" \
            if off > 1e-9 else HINT
        results.append({"case": name, "difference": off, "hint": hint})
    return outcome(results, tol=1e-9, what="your FLOPs per token", reference="the counter's count",
                   relative=True)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_flops_per_token(")
