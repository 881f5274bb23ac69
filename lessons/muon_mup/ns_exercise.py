"""Lesson 19, your turn: the Newton–Schulz iteration at Muon's heart, checked against the update torch.optim.Muon
makes from the same matrix; then your iteration trains section 2's Muon runs."""

import inspect
import math

import torch

from labtools.exercises import Case, Outcome, attempt, failed
from labtools.learner import is_stub
from labtools.optim import NS_COEFFICIENTS

TOL = 0.1  # relative difference ‖yours − torch's‖ / ‖torch's‖: bf16 rounding stays under 0.04, each mistake above 0.2
HINT = ("X = G / ‖G‖_F in bf16, then five times: A = X Xᵀ, X ← a X + (b A + c A²) X with (a, b, c) = "
        f"{NS_COEFFICIENTS}; a tall matrix may be iterated transposed")


def reference(G, steps=5):
    """G with its singular values pushed towards 1: Muon's quintic Newton–Schulz iteration, in bf16."""
    a, b, c = 3.4445, -4.7750, 2.0315        # Jordan et al.'s coefficients: steep at 0, landing near 1
    X = G.bfloat16()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T                              # iterate on the wide side: A = X Xᵀ is the smaller Gram matrix
    X = X / X.norm().clamp(min=1e-7)         # the Frobenius norm bounds the largest singular value: all in [0, 1]
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X  # each singular value σ becomes aσ + bσ³ + cσ⁵
    return X.T if tall else X


def torch_orthogonalized(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """What torch.optim.Muon does to G: one step from zero weights, with learning rate 1, no momentum and no decay,
    moves the weights by −√max(1, rows/cols) times its orthogonalized update."""
    p = torch.zeros(G.shape, requires_grad=True)
    opt = torch.optim.Muon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False, ns_steps=steps)
    p.grad = G.detach().clone().float()
    opt.step()
    return -p.detach() / math.sqrt(max(1.0, G.size(0) / G.size(1)))


def _matrix(rows: int, cols: int, seed: int, condition: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(rows, cols, generator=g) * 1e-3  # a gradient's scale
    if condition:  # singular values spread from 1 down to 1/condition: one direction dominates
        U, _, V = torch.linalg.svd(G, full_matrices=False)
        G = U @ torch.diag(torch.logspace(0, -math.log10(condition), min(rows, cols))) @ V * 1e-3
    return G


def cases(momentum: torch.Tensor | None = None) -> list[Case]:
    out = [Case("a square 48 × 48 matrix", (_matrix(48, 48, 0),)),
           Case("a wide 32 × 96 matrix", (_matrix(32, 96, 1),)),
           Case("a tall 96 × 32 matrix", (_matrix(96, 32, 2),),
                hint="for rows > cols, iterate on Xᵀ (or keep A = X Xᵀ rows × rows): the output has G's shape"),
           Case("one direction 100 times the smallest", (_matrix(64, 64, 3, condition=100.0),),
                hint="five steps raise even the smallest singular values towards 1: that is the point of Muon")]
    if momentum is not None:
        out.append(Case("a momentum matrix of this lesson's model", (momentum,), hint=HINT))
    return out


def check_newton_schulz(fn, momentum: torch.Tensor | None = None) -> Outcome:
    """Your iteration against torch.optim.Muon's update on four matrices (and the lesson's own, given momentum):
    the relative difference ‖yours − torch's‖ / ‖torch's‖ must stay within TOL (bf16 rounds differently when the
    same sums are written in another order)."""
    if is_stub(fn):
        return attempt(fn, _matrix(4, 4, 0)).outcome
    worst = 0.0
    for case in cases(momentum):
        G = case.args[0]
        tried = attempt(fn, G.clone(), case=case.name, hint=case.hint)
        if not tried.returned:
            return tried.outcome
        got, expected = tried.value, torch_orthogonalized(G)
        if not torch.is_tensor(got) or got.shape != expected.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(case.name, f"returned {shape}, expected a tensor of G's shape {tuple(expected.shape)}",
                          case.hint or HINT)
        d = _relative(got, expected)
        worst = max(worst, d if math.isfinite(d) else math.inf)
        if not d <= TOL:
            named = misconception(got, G)
            differs = (f"your output differs from PyTorch's Muon update by {d:.0%} of its size (allowed {TOL:.0%})"
                       if math.isfinite(d) else "your output holds inf or NaN where PyTorch's Muon update is finite")
            return Outcome("fail", f"case '{case.name}': {differs} — hint: {named or case.hint or HINT}", d)
    return Outcome("pass", f"your Newton–Schulz matches PyTorch's Muon update on {len(cases(momentum))} matrices "
                           f"(largest difference {worst:.1%} of its size, bf16 rounding)", worst)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.detach().double() - expected.double()).norm() / expected.double().norm()).item()


def _variant(G, *, normalise="frobenius", coefficients=NS_COEFFICIENTS, steps=5, left=True):
    a, b, c = coefficients
    X = G.double()
    if normalise == "frobenius":
        X = X / X.norm()
    elif normalise == "spectral":
        X = X / torch.linalg.matrix_norm(X, 2)
    for _ in range(steps):
        A = X @ X.T
        P = b * A + c * A @ A
        X = a * X + (P @ X if left else (X.T @ P.T).T if X.size(0) != X.size(1) else X @ P)
    return X


def misconception(got: torch.Tensor, G: torch.Tensor) -> str:
    """The typical mistake the output matches, in words ("" if none)."""
    U, _, V = torch.linalg.svd(G.double(), full_matrices=False)
    known = {
        "divide by the Frobenius norm, G.norm(), as Muon does: it bounds the largest singular value and costs one "
        "sum, where the spectral norm needs an SVD": _variant(G, normalise="spectral"),
        "the coefficients go a X + (b A + c A²) X, with (a, b, c) = (3.4445, −4.7750, 2.0315) in that order":
            _variant(G, coefficients=NS_COEFFICIENTS[::-1]),
        "five steps, each raising the small singular values further": _variant(G, steps=4),
        "the classic cubic step (1.5 X − 0.5 A X) converges slowly from small singular values: Muon's quintic "
        "coefficients make the first steps steep": _variant(G, coefficients=(1.5, -0.5, 0.0)),
        "Muon does not compute the exact U Vᵀ: five Newton–Schulz steps leave the singular values between about 0.7 "
        "and 1.2, and cost only matrix products, which a GPU runs fast": U @ V,
        "the polynomial in A = X Xᵀ multiplies X from the left: (b A + c A²) X": _variant(G, left=False),
    }
    known["start from X = G / ‖G‖_F: the iteration pulls singular values in [0, 1] towards 1 (and blows up those "
          "above it)"] = _variant(G, normalise=None)
    for what, v in known.items():
        finite = [bool(torch.isfinite(x).all() and x.abs().max() < 1e6) for x in (got, v)]  # blown up or not
        if v.shape == got.shape and (_relative(got, v) < TOL if all(finite) else not any(finite)):
            return what
    return ""


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_newton_schulz(")
