"""Lesson 01, your turn: where weight decay enters Adam, checked inside a full Adam run against torch.optim.AdamW
(decoupled) and torch.optim.Adam(weight_decay=λ) (L2, coupled)."""

import inspect
import math

import torch

from labtools.exercises import Outcome, attempt, failed, outcome

STEPS, BETAS, EPS = 25, (0.9, 0.95), 1e-8
TOL = 1e-10  # the largest difference allowed in the final weights (float64 throughout)
# (name, decoupled, lr, λ, hint shown if this case fails)
CASES = [
    ("AdamW, λ = 0.1", True, 1e-2, 0.1,
     "AdamW shrinks the weights directly, p·(1 − lr·λ), and leaves the gradient alone"),
    ("Adam + L2, λ = 0.1", False, 1e-2, 0.1,
     "L2 adds λ·p to the gradient and leaves p alone: the decay then passes through m and v"),
    ("no decay, λ = 0", True, 1e-2, 0.0, "with λ = 0 both forms leave p and g as they are"),
    ("AdamW, lr·λ = 0.05", True, 0.1, 0.5, "the factor is 1 − lr·λ: both the learning rate and λ"),
    ("Adam + L2, λ = 2", False, 1e-2, 2.0, "L2's term is λ·p, added to g"),
]


def _problem(seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Start weights and one gradient per step, float64, magnitudes from 1e-3 to 10 (as in section 0)."""
    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(32, generator=g, dtype=torch.float64)
    scale = torch.logspace(-3, 1, 32, dtype=torch.float64)
    return p0, [torch.randn(32, generator=g, dtype=torch.float64) * scale for _ in range(STEPS)]


def adam_with(decay, decoupled: bool, lr: float, wd: float) -> torch.Tensor | None:
    """Adam written out, with `decay(p, g, lr, weight_decay, decoupled) -> (p, g)` applied before each step: the
    final weights, or None where decay did not return that pair."""
    p, grads = _problem()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    (b1, b2) = BETAS
    for t, g in enumerate(grads, start=1):
        out = decay(p.clone(), g.clone(), lr, wd, decoupled)
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, torch.Tensor) and x.shape == p.shape
                                                                  for x in out)):
            return None
        p, g = out
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = (v.sqrt() / math.sqrt(1 - b2**t)) + EPS
        p = p - (lr / (1 - b1**t)) * m / denom
    return p


def torch_adam(decoupled: bool, lr: float, wd: float) -> torch.Tensor:
    """The reference: torch.optim.AdamW (decoupled) or torch.optim.Adam(weight_decay=λ) over the same gradients."""
    p0, grads = _problem()
    p = p0.clone().requires_grad_(True)
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)([p], lr=lr, betas=BETAS, eps=EPS, weight_decay=wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def reference(p, g, lr, weight_decay, decoupled):
    """Weight decay before Adam's moments: AdamW's on the weights, L2's through the gradient. Returns (p, g)."""
    if decoupled:
        p = p * (1 - lr * weight_decay)  # AdamW: every weight shrinks by the same factor
    else:
        g = g + weight_decay * p         # Adam + L2: λθ joins the gradient, so √v̂ will divide it
    return p, g


def check_decay(fn) -> Outcome:
    """Your decay inside 25 Adam steps against torch's AdamW and Adam(weight_decay), five cases."""
    results = []
    for name, decoupled, lr, wd, hint in CASES:
        tried = attempt(adam_with, fn, decoupled, lr, wd, case=name, hint=hint, whose=fn)  # the whole run, bounded
        if not tried.returned:
            return tried.outcome
        if tried.value is None:
            return failed(name, "return the pair (p, g): two tensors shaped like the ones given")
        d = (tried.value - torch_adam(decoupled, lr, wd)).abs().max().item()
        results.append({"case": name, "difference": d, "hint": hint})
        if not d <= TOL:
            break  # the first case off is the verdict
    return outcome(results, tol=TOL, what=f"your weight decay, inside {STEPS} Adam steps,",
                   reference="torch's AdamW / Adam(weight_decay)")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_weight_decay(")
