"""Lesson 20, your turn: DPO's loss, checked against the formula (Rafailov et al. 2023, eq. 7) on fixed
log-probabilities; then your loss runs the lesson's DPO (dpo.with_yours)."""

import inspect
import math

import torch
import torch.nn.functional as F

from labtools.exercises import Case, Outcome, attempt, failed
from labtools.learner import is_stub

TOL = 1e-6  # nats
HINT = ("the margin is β × [(log π(chosen) − log π_ref(chosen)) − (log π(rejected) − log π_ref(rejected))]; the "
        "loss is the mean over pairs of −log σ(margin)")


def reference(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta):
    """DPO's loss, the mean over pairs of −log σ(β [(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]):
    each argument (N,) an answer's log-probability, summed over its characters."""
    chosen = pi_chosen - ref_chosen        # how much more likely the policy makes the chosen answer than the reference
    rejected = pi_rejected - ref_rejected  # the same for the rejected one
    margin = beta * (chosen - rejected)    # the implicit reward margin
    return -F.logsigmoid(margin).mean()    # logsigmoid stays finite where log(sigmoid(x)) underflows to -inf


def lab(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta):
    from labtools.posttrain import dpo_loss
    return dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta)


def _logprobs(n: int, seed: int, scale: float = 3.0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(-(torch.rand(n, generator=g) * scale).double() for _ in range(4))


def cases() -> list[Case]:
    ref_equal = _logprobs(6, 1)
    ref_equal = (ref_equal[0], ref_equal[1], ref_equal[0].clone(), ref_equal[1].clone())  # policy = reference
    far = (torch.tensor([-1.0, -1000.0]).double(), torch.tensor([-1000.0, -1.0]).double(),
           torch.tensor([-2.0, -2.0]).double(), torch.tensor([-2.0, -2.0]).double())
    return [Case("five pairs, β = 0.5", _logprobs(5, 0) + (0.5,)),
            Case("the policy still equals the reference (every margin 0), β = 1", ref_equal + (1.0,),
                 hint="with π = π_ref every margin is 0 and the loss is log 2 for any β: the start of every DPO run"),
            Case("a pair the policy gets badly wrong: margin −999, β = 1", far + (1.0,),
                 hint="sigmoid(x) rounds to 0 for x below about −745 in float64, and its log to −inf; "
                      "F.logsigmoid(x) does not"),
            Case("eight pairs, β = 0.1", _logprobs(8, 2) + (0.1,))]


def check_dpo_loss(fn) -> Outcome:
    """Your loss against the formula on four sets of fixed log-probabilities, within TOL nats."""
    if is_stub(fn):
        return attempt(fn, *cases()[0].args).outcome
    worst = 0.0
    for case in cases():
        tried = attempt(fn, *[a.clone() if torch.is_tensor(a) else a for a in case.args], case=case.name,
                        hint=case.hint or HINT)
        if not tried.returned:
            return tried.outcome
        got, expected = tried.value, lab(*case.args)
        if not torch.is_tensor(got) or got.numel() != 1:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(case.name, f"returned {shape}, expected one number (a 0-d tensor): the mean over pairs",
                          HINT)
        value = got.detach().double().item()
        d = abs(value - expected.item()) if math.isfinite(value) else math.inf
        worst = max(worst, d)
        if not d <= TOL:
            named = misconception(value, *case.args)
            return Outcome("fail", f"case '{case.name}': yours gave {value:.6g} nats where the formula gives "
                                   f"{expected.item():.6g} — hint: {named or case.hint or HINT}", d)
    return Outcome("pass", f"your DPO loss matches the formula on {len(cases())} sets of pairs (largest difference "
                           f"{worst:.0e} nats)", worst)


def misconception(value: float, pw, pl, rw, rl, beta) -> str:
    """The typical mistake the value matches, in words ("" if none)."""
    m = beta * ((pw - rw) - (pl - rl))
    known = {
        "the chosen answer's term comes first: a positive margin (the policy favouring the chosen answer more than "
        "the reference does) must lower the loss": -F.logsigmoid(-m).mean(),
        "measure each answer against the reference model: subtract log π_ref from log π before taking the "
        "difference": -F.logsigmoid(beta * (pw - pl)).mean(),
        "β multiplies the margin inside the sigmoid, not the loss outside it":
            -F.logsigmoid((pw - rw) - (pl - rl)).mean() * beta,
        "multiply the margin by β: it sets how far the policy may move from the reference":
            -F.logsigmoid((pw - rw) - (pl - rl)).mean(),
        "the loss is −log σ(margin), not −σ(margin): the log keeps pushing pairs that are already right, a little":
            -torch.sigmoid(m).mean(),
        "a loss is a mean over pairs, not a sum": -F.logsigmoid(m).sum(),
    }
    if not math.isfinite(value):
        return "log(sigmoid(x)) underflows to −inf far below zero: F.logsigmoid(x) computes the same, stably"
    for what, v in known.items():
        if abs(value - v.item()) <= 1e-6:
            return what
    return ""


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_dpo_loss(")
