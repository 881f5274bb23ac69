"""Lesson 20, your turn: the fine-tuning loss on the answer only, checked against PyTorch's cross-entropy with
ignore_index; then your loss fine-tunes the lesson's model (sft.with_yours)."""

import inspect
import math

import torch
import torch.nn.functional as F

from labtools.chat import IGNORE
from labtools.exercises import Case, Outcome, attempt, failed
from labtools.learner import is_stub
from lessons.finetune import TEMPLATE

TOL = 1e-5  # nats: float32 sums in another order differ by about 1e-7
HINT = ("log_softmax over the last dimension, pick each target's log-probability, keep the positions whose target "
        f"is not {IGNORE}, and average minus those over every kept position of the batch")


def reference(logits, targets):
    """Mean cross-entropy over the positions whose target is not IGNORE (-100): logits (B, T, V), targets (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)              # (B, T, V)
    keep = targets != -100                                        # the answer's positions
    picked = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]  # a masked target's index is never used
    return -(picked * keep).sum() / keep.sum()                    # the mean over every kept position of the batch


def lab(logits, targets):
    """PyTorch's own: what fine-tuning uses when you have not written yours."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE)


def _masked_batch(rows: int, seed: int, vocab: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Random logits and the targets of `rows` template lines: the prompt's positions IGNORE."""
    from labtools.tasks import Addition
    g = torch.Generator().manual_seed(seed)
    problems = Addition(2).problems()
    pick = torch.randint(len(problems), (rows,), generator=g).tolist()
    _, Y = TEMPLATE.examples([problems[i] for i in pick])
    return torch.randn(rows, Y.size(1), vocab, generator=g) * 2, Y


def _ragged(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that count different numbers of positions: a mean per row differs from the mean over positions."""
    logits, Y = _masked_batch(4, seed)
    Y[0, :-1] = IGNORE  # the first row counts its end tag alone
    return logits, Y


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    every = (torch.randn(3, 5, 20, generator=g), torch.randint(20, (3, 5), generator=g))
    return [Case("every position counts (no -100)", every, hint="with nothing masked this is the plain mean "
                 "cross-entropy: minus the mean log-probability of the targets"),
            Case("fine-tuning lines: the question's positions are -100", _masked_batch(8, 1)),
            Case("rows that count different numbers of positions", _ragged(2),
                 hint="average over every counted position of the batch, not row by row: a row with one counted "
                      "position must weigh less than one with four")]


def check_sft_loss(fn) -> Outcome:
    """Your loss against PyTorch's cross-entropy with ignore_index=-100 on three batches, within TOL nats."""
    if is_stub(fn):
        return attempt(fn, *cases()[0].args).outcome
    worst = 0.0
    for case in cases():
        logits, targets = case.args
        tried = attempt(fn, logits.clone(), targets.clone(), case=case.name, hint=case.hint or HINT)
        if not tried.returned:
            return tried.outcome
        got, expected = tried.value, lab(logits, targets)
        if not torch.is_tensor(got) or got.numel() != 1:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(case.name, f"returned {shape}, expected one number (a 0-d tensor) to call .backward() on",
                          "reduce to one number: the mean over the counted positions")
        d = abs(got.detach().double().item() - expected.double().item())
        worst = max(worst, d if math.isfinite(d) else math.inf)
        if not d <= TOL:
            named = misconception(got, logits, targets)
            return Outcome("fail", f"case '{case.name}': yours gave {got.item():.4f} nats where cross-entropy gives "
                                   f"{expected.item():.4f} — hint: {named or case.hint or HINT}", d)
    return Outcome("pass", f"your loss matches PyTorch's cross-entropy with ignore_index on {len(cases())} batches "
                           f"(largest difference {worst:.0e} nats)", worst)


def misconception(got: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> str:
    """The typical mistake the output matches, in words ("" if none)."""
    logp = torch.log_softmax(logits.double(), -1)
    keep = targets != IGNORE
    picked = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    known = {
        "divide by the number of counted positions, not by every position: the masked ones add nothing to the "
        "sum and must add nothing to the count": -(picked * keep).sum() / keep.numel(),
        "a loss is a mean, not a sum: summed, it grows with the batch and the learning rate must shrink with it":
            -(picked * keep).sum(),
        "average over every counted position of the batch at once, not row by row (cross-entropy's "
        "ignore_index does the former)": -((picked * keep).sum(1) / keep.sum(1).clamp(min=1)).mean(),
        "leave out the positions whose target is -100: here they were counted as if their target were token 0":
            -picked.mean(),
        "the loss is minus the log-probability: the mean log-probability itself is negative":
            (picked * keep).sum() / keep.sum(),
    }
    if logits.size(1) > 1:
        shifted = torch.log_softmax(logits[:, :-1].double(), -1)
        t = targets[:, 1:]
        k = t != IGNORE
        known["targets are already the next characters (Y is X shifted by one): compare logits[:, t] with "
              "targets[:, t], with no second shift"] = \
            -(shifted.gather(-1, t.clamp(min=0)[..., None])[..., 0] * k).sum() / k.sum()
    for what, v in known.items():
        if abs(got.detach().double().item() - v.item()) <= 1e-4:
            return what
    return ""


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_sft_loss(")
