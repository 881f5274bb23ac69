"""Lesson 21, your turn: GRPO's group-relative advantages (Shao et al. 2024, DeepSeekMath, section 4.1.2), checked
against the lab's; then your advantages train the lesson's GRPO run (grpo.with_yours)."""

import inspect
import math
import warnings

import torch

from labtools.exercises import Case, Outcome, attempt, failed
from labtools.learner import is_stub
from labtools.posttrain import group_advantages

TOL = 1e-5
EPS = 1e-4  # added to the standard deviation: a group whose answers all scored alike gets 0, not 0/0
HINT = ("within each row (one prompt's group): the reward minus the row's mean, divided by the row's standard "
        f"deviation plus {EPS}")


def reference(rewards):
    """rewards (P, G): G answers to each of P prompts. Each answer's reward minus its group's mean, divided by its
    group's standard deviation (+ 1e-4, so that a group whose answers all scored alike gets 0, not 0/0)."""
    mean = rewards.mean(dim=1, keepdim=True)   # one mean per prompt: compare answers to the same question only
    std = rewards.std(dim=1, keepdim=True)     # torch's std: the n − 1 estimate
    return (rewards - mean) / (std + 1e-4)


def _population(rewards):  # the n-denominator standard deviation: a convention as valid as torch's default
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True, correction=0) + EPS)


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    return [Case("one group of eight, three right", (torch.tensor([[1.0, 0, 0, 1, 0, 0, 1, 0]]),)),
            Case("four groups of eight", ((torch.rand(4, 8, generator=g) < 0.5).float(),),
                 hint="each row is its own group: its own mean and its own standard deviation"),
            Case("a group where every answer was right, beside a mixed one", (torch.tensor([[1.0, 1, 1, 1],
                                                                                            [1.0, 0, 0, 0]]),),
                 hint=f"a group that scored alike has standard deviation 0: add {EPS} to it, and its advantages are "
                      "0 (nothing to learn), not NaN"),
            Case("rewards between 0 and 1 (a partial-credit verifier)", (torch.rand(3, 6, generator=g),))]


def check_advantages(fn) -> Outcome:
    """Your advantages against the lab's on four sets of rewards, within TOL (torch's n − 1 standard deviation, or
    the n one: both are in use)."""
    if is_stub(fn):
        return attempt(fn, *cases()[0].args).outcome
    worst = 0.0
    for case in cases():
        (rewards,) = case.args
        tried = attempt(fn, rewards.clone(), case=case.name, hint=case.hint or HINT)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if not torch.is_tensor(got) or got.shape != rewards.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(case.name, f"returned {shape}, expected one advantage per answer: shape "
                                     f"{tuple(rewards.shape)}", HINT)
        d = min(_gap(got, group_advantages(rewards)), _gap(got, _population(rewards)))
        worst = max(worst, d)
        if not d <= TOL:
            named = misconception(got, rewards)
            return Outcome("fail", f"case '{case.name}': yours differ from the group-relative advantages by up to "
                                   f"{d:.3g} — hint: {named or case.hint or HINT}", d)
    return Outcome("pass", f"your advantages match GRPO's on {len(cases())} sets of groups (largest difference "
                           f"{worst:.0e})", worst)


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.detach().double() - b.double()).abs()
    return math.inf if not torch.isfinite(d).all() else d.max().item()


def misconception(got: torch.Tensor, rewards: torch.Tensor) -> str:
    """The typical mistake the output matches, in words ("" if none)."""
    with warnings.catch_warnings():  # a column's std over one row is NaN, as the learner's would be: no warning
        warnings.simplefilter("ignore", UserWarning)
        return _named(got, rewards.double())


def _named(got: torch.Tensor, r: torch.Tensor) -> str:
    mean, std = r.mean(1, keepdim=True), r.std(1, keepdim=True)
    known = {
        "subtract each group's own mean, not the batch's: an answer is better or worse than the other answers to the "
        "same question": (r - r.mean()) / (r.std() + EPS),
        "GRPO also divides by the group's standard deviation (+ 1e-4), so that every mixed group weighs alike":
            r - mean,
        "the advantage is the reward minus the group's mean: a right answer gets a positive one":
            (mean - r) / (std + EPS),
        f"add {EPS} to the standard deviation before dividing: without it a group that scored alike gives 0/0":
            (r - mean) / std,
        "normalise within each row (a prompt's group), not within each column": (r - r.mean(0, keepdim=True))
            / (r.std(0, keepdim=True) + EPS),
    }
    for what, v in known.items():
        if v.shape == got.shape and torch.allclose(got.detach().double(), v, atol=1e-4, equal_nan=True):
            return what
    if not torch.isfinite(got).all():
        return (f"a group whose answers all scored alike has standard deviation 0: add {EPS} before dividing, so its "
                "advantages are 0")
    return ""


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_group_advantages(")
