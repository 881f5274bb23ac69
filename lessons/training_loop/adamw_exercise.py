"""Lesson 00, your turn: one AdamW step by hand, checked against torch.optim.AdamW on the same state."""

import inspect

import torch

from dataclasses import replace

from labtools.data import Corpus
from labtools.exercises import Case, Outcome, YourRun, check, run_yours
from labtools.optim import param_groups
from labtools.train import History, train
from lessons.training_loop import Settings, build_model, train_config

HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
TRAIN_TOL = 1e-3  # nats: float rounding in another order, over hundreds of steps (Adam + L2 parts by far more)


def torch_adamw_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """The reference: torch.optim.AdamW given the same moments at step t − 1, one step. Returns (p, m, v)."""
    p = p.clone().requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    opt.state[p] = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    p.grad = g.clone()
    opt.step()
    state = opt.state[p]
    return p.detach(), state["exp_avg"], state["exp_avg_sq"]


def reference(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """One AdamW step at step t = 1, 2, …: returns the new (p, m, v)."""
    m = beta1 * m + (1 - beta1) * g             # moving average of the gradient
    v = beta2 * v + (1 - beta2) * g * g         # ... and of its square
    m_hat = m / (1 - beta1**t)                  # bias correction: both start at 0
    v_hat = v / (1 - beta2**t)
    p = p * (1 - lr * weight_decay)             # decoupled weight decay: on the weights, not through g
    p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p, m, v


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    p, grad = rand(6), rand(6)
    m, v = 0.1 * rand(6), 0.01 * rand(6).abs()
    return [
        Case("first step, no decay", (p, grad, torch.zeros(6), torch.zeros(6), 1, *HYPER.values(), 0.0),
             hint="at t = 1 bias correction divides m by 1 − β1 and v by 1 − β2: each entry moves by about lr"),
        Case("step 5, no decay", (p, grad, m, v, 5, *HYPER.values(), 0.0),
             hint="update m and v first, then divide by 1 − β^t with the step t (here 5)"),
        Case("step 5, weight decay 0.1", (p, grad, m, v, 5, *HYPER.values(), 0.1),
             hint="AdamW decays the weights directly, p ← p·(1 − lr·λ); adding λ·p to the gradient is Adam + L2"),
        Case("step 5, a large rate and decay", (p, grad, m, v, 5, 0.5, HYPER["beta1"], HYPER["beta2"], HYPER["eps"],
                                                0.5),
             hint="the decay shrinks the weights as they were before this step, θ·(1 − lr·λ) − lr·update, not the "
                  "weights after the update"),
        Case("a zero and a huge gradient entry", (p, torch.tensor([0.0, 1e4, 1.0, -1.0, 0.5, 0.0]), m,
                                                  v * torch.tensor([0.0, 1, 1, 1, 1, 1]), 3, *HYPER.values(), 0.1),
             hint="ε goes outside the square root, m̂ / (√v̂ + ε): where v̂ = 0 it is all that divides"),
    ]


def check_step(fn) -> Outcome:
    """Your step against torch.optim.AdamW on five states (first step, later steps, weight decay, a large rate and
    decay, extremes)."""
    return check(fn, torch_adamw_step, cases(), tol=1e-5, relative=True, what="your AdamW step",
                 against="torch.optim.AdamW")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_adamw_step(")


class YourAdamW(torch.optim.Optimizer):
    """torch.optim's interface around a one-tensor step like yours: it keeps m, v and the step t for each parameter
    and calls step_fn(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> (p, m, v) on each, with its group's
    learning rate (as the schedule set it) and weight decay (none for biases and norms)."""

    def __init__(self, params, step_fn, lr: float, betas: tuple[float, float], eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))
        self.step_fn = step_fn

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["t"] += 1
                new, state["m"], state["v"] = self.step_fn(p.detach().clone(), p.grad.detach().clone(), state["m"],
                                                           state["v"], state["t"], group["lr"], beta1, beta2,
                                                           group["eps"], group["weight_decay"])
                p.copy_(new)


def train_with_yours(fn, S: Settings, corpus: Corpus, lab: History) -> YourRun:
    """Section 3's run again, its first half, with your step in place of torch.optim.AdamW: the same model, seed,
    batches and schedule. Your curve should lie on the lab's, to float rounding."""
    def run(step_fn) -> History:
        model = build_model(S, corpus.vocab_size)
        optimizer = YourAdamW(param_groups(model, weight_decay=0.1), step_fn, S.lr, (0.9, 0.95))
        cfg = replace(train_config(S, S.steps, "your AdamW"), stop_at=S.steps // 2)
        return train(model, corpus, cfg, optimizer=optimizer)
    return run_yours(fn, run, lab, what="your AdamW step", tol=TRAIN_TOL)
