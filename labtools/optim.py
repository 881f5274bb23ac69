"""Optimizers written from scratch, one update rule each, plus state accounting and param groups.

Each class is a torch.optim.Optimizer whose step() is the textbook rule, written per tensor
for reading, not speed. tests/test_optim.py checks each against its PyTorch counterpart
(SGD, Adam, Adam with weight_decay (= AdamL2), AdamW, Adafactor) to <= 1e-6, Muon to the bit; Lion has no
PyTorch counterpart and is checked against a per-step table.

Notation: g gradient, θ parameter, lr learning rate, λ weight decay, t step (from 1).
Introduced in notebooks/01_adamw_vs_adam_l2.ipynb.
"""

import math

import torch
import torch.nn as nn
from torch.optim import Optimizer


class SGD(Optimizer):
    """SGD with optional momentum and coupled (L2) weight decay, as torch.optim.SGD (dampening 0).

        g ← g + λθ
        b ← μ b + g           (b = g at the first step)
        θ ← θ − lr · b        (or, with nesterov: θ ← θ − lr · (g + μ b))
    """

    def __init__(self, params, lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0; got {lr}, {momentum}, {weight_decay}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if wd:
                    g = g.add(p, alpha=wd)
                if mu:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = g.clone()
                    else:
                        state["momentum_buffer"].mul_(mu).add_(g)
                    b = state["momentum_buffer"]
                    g = g.add(b, alpha=mu) if group["nesterov"] else b
                p.add_(g, alpha=-lr)


class _AdamBase(Optimizer):
    """Shared Adam moment update; subclasses say where weight decay enters."""

    decoupled: bool | None = None  # True: AdamW; False: L2 added to the gradient; None: no decay

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if lr <= 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"need lr > 0, eps >= 0, weight_decay >= 0, 0 <= betas < 1; "
                             f"got {lr}, {eps}, {weight_decay}, {betas}")
        if self.decoupled is None and weight_decay:
            raise ValueError("Adam here has no weight decay: use AdamL2 (coupled) or AdamW (decoupled)")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    adam_update(p, self.state[p], group, self.decoupled)


def adam_update(p: torch.Tensor, state: dict, group: dict, decoupled: bool | None) -> None:
    """One Adam step of p from p.grad, its moments in state; decoupled: AdamW's decay (False: L2, None: none)."""
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    g = p.grad
    if wd and decoupled:  # AdamW: shrink θ directly, whatever the gradient history
        p.mul_(1 - (lr / group["base_lr"] if group.get("independent_decay") else lr) * wd)
    elif wd:
        g = g.add(p, alpha=wd)  # L2: λθ joins the gradient, so it is divided by √v̂ below
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p)     # m: first moment
        state["exp_avg_sq"] = torch.zeros_like(p)  # v: second moment
    state["step"] += 1
    t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(g, 1 - beta1)                      # m ← β1 m + (1 − β1) g
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v ← β2 v + (1 − β2) g²
    bias1, bias2 = 1 - beta1**t, 1 - beta2**t
    denom = (v.sqrt() / math.sqrt(bias2)).add_(eps)  # √v̂ + ε
    p.addcdiv_(m, denom, value=-lr / bias1)          # θ ← θ − lr · m̂ / (√v̂ + ε)


class Adam(_AdamBase):
    """Adam (Kingma & Ba 2015), no weight decay.

        m ← β1 m + (1 − β1) g;   v ← β2 v + (1 − β2) g²
        m̂ = m / (1 − β1^t);      v̂ = v / (1 − β2^t)
        θ ← θ − lr · m̂ / (√v̂ + ε)
    """
    decoupled = None


class AdamL2(_AdamBase):
    """Adam with L2 regularisation: g ← g + λθ, then Adam (= torch.optim.Adam(weight_decay=λ)).

    The decay term passes through the moments, so it is divided by √v̂: parameters with a large
    gradient history are barely regularised (Loshchilov & Hutter 2019, "Decoupled Weight Decay
    Regularization").
    """
    decoupled = False


class AdamW(_AdamBase):
    """AdamW: θ ← θ (1 − lr·λ), then Adam on the raw gradient (= torch.optim.AdamW).

    Every parameter shrinks by the same factor per step, whatever its gradient history.

    independent_decay=True is Loshchilov & Hutter's own form (their Algorithm 2): θ ← θ (1 − η_t·λ), where η_t
    is the schedule multiplier — the current lr ÷ the lr the optimizer was built with — not the learning rate
    α·η_t. The decay then does not scale with α, which is what lets their best λ stay put when α changes;
    torch's form multiplies λ by α again. Equal to torch.optim.AdamW(weight_decay=λ/α) (tested).
    """
    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, independent_decay: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        for group in self.param_groups:
            group.setdefault("independent_decay", independent_decay)
            group.setdefault("base_lr", group["lr"])  # α: η_t = lr / base_lr


class Lion(Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"). No PyTorch counterpart.

        c ← β1 m + (1 − β1) g
        θ ← θ (1 − lr·λ) − lr · sign(c)    every coordinate moves by exactly lr (plus decay)
        m ← β2 m + (1 − β2) g              one state tensor: 4 bytes/param in fp32
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        if lr <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"need lr > 0, weight_decay >= 0, 0 <= betas < 1; got {lr}, {weight_decay}, {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                c = m.lerp(p.grad, 1 - beta1)
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(torch.sign(c), alpha=-lr)
                m.lerp_(p.grad, 1 - beta2)


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern 2018) in the form torch.optim.Adafactor implements.

    For a matrix gradient (n, m) the second moment is factored: keep the row means R (n, 1) and
    column means C (1, m) of g² and estimate V ≈ R C / mean(R): n + m numbers instead of n·m.
        β2_t = 1 − t^(−0.8)                    R, C (or v for vectors) ← β2_t · old + (1 − β2_t) · new
        U = g / √max(V, ε1²);  U ← U / max(1, RMS(U) / d)   update clipping
        θ ← θ (1 − lr·λ) − max(ε2, RMS(θ)) · min(lr, 1/√t) · U   relative step size
    Simplified relative to the paper: no first moment (β1 = 0, the paper's memory-saving
    setting); ε1 clamps V instead of being added to g²; only the last two dimensions are factored.
    """

    def __init__(self, params, lr: float = 1e-2, beta2_decay: float = -0.8, eps: tuple = (None, 1e-3),
                 d: float = 1.0, weight_decay: float = 0.0):
        if lr <= 0 or beta2_decay > 0 or d < 1 or weight_decay < 0:
            raise ValueError(f"need lr > 0, beta2_decay <= 0, d >= 1, weight_decay >= 0; "
                             f"got {lr}, {beta2_decay}, {d}, {weight_decay}")
        super().__init__(params, dict(lr=lr, beta2_decay=beta2_decay, eps=eps, d=d, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, d, wd = group["lr"], group["d"], group["weight_decay"]
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                e1 = torch.finfo(p.dtype).eps if eps1 is None else eps1
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    if g.dim() > 1:
                        state["row_var"] = g.new_zeros(g.shape[:-1] + (1,))             # (..., n, 1)
                        state["col_var"] = g.new_zeros(g.shape[:-2] + (1, g.shape[-1]))  # (..., 1, m)
                    else:
                        state["variance"] = torch.zeros_like(g)
                state["step"] += 1
                t = state["step"]
                new_weight = t ** group["beta2_decay"]  # 1 − β2_t
                rho = min(lr, 1 / math.sqrt(t))
                alpha = max(eps2, p.norm().item() / math.sqrt(p.numel())) * rho
                if wd:
                    p.mul_(1 - lr * wd)
                g2 = g * g
                if g.dim() > 1:
                    R, C = state["row_var"], state["col_var"]
                    R.lerp_(g2.mean(dim=-1, keepdim=True), new_weight)
                    C.lerp_(g2.mean(dim=-2, keepdim=True), new_weight)
                    V = (R @ C) / R.mean(dim=-2, keepdim=True).clamp(min=e1)  # rank-1 estimate of E[g²]
                else:
                    state["variance"].lerp_(g2, new_weight)
                    V = state["variance"].clone()
                U = g * V.clamp(min=e1 * e1).rsqrt()
                clip = max(1.0, U.norm().item() / (math.sqrt(U.numel()) * d))
                p.add_(U, alpha=-alpha / clip)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.'s quintic (torch.optim.Muon's defaults)


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = 1e-7) -> torch.Tensor:
    """G with its singular values pushed towards 1, in bf16: X ← aX + (bA + cA²)X, A = XXᵀ, from X = G / ‖G‖_F.

    The Frobenius norm bounds the largest singular value, so every singular value starts in [0, 1]; each step maps
    a singular value σ to aσ + bσ³ + cσ⁵, which these coefficients make steep at 0 and land near 1 (between about
    0.7 and 1.2, not exactly 1). A tall matrix is iterated transposed, so A is the smaller Gram matrix. The same
    operations in the same order as torch.optim.Muon's, so the same bits (tested)."""
    a, b, c = coefficients
    X = G.bfloat16()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.T
        B = torch.addmm(A, A, A, beta=b, alpha=c)  # bA + cA²
        X = torch.addmm(X, B, X, beta=a)           # aX + BX
    return X.T if tall else X


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> int:
    """Multiply-adds ×2 of newton_schulz on a rows × cols matrix: per step XXᵀ (2m²n), A² (2m³), BX (2m²n), with
    m the smaller side and n the larger."""
    m, n = sorted((rows, cols))
    return steps * (4 * m * m * n + 2 * m ** 3)


class Muon(Optimizer):
    """Muon (Jordan et al. 2024) for the groups marked use_muon, AdamW for the others, in one optimizer.

    A Muon group's matrix θ (rows × cols), as torch.optim.Muon steps it:
        B ← μ B + (1 − μ) g                      momentum, an average of gradients
        U = (1 − μ) g + μ B  (Nesterov)  or  B
        O = orthogonalize(U)                     newton_schulz: every direction of the update the same size
        θ ← θ (1 − lr·λ) − lr · √max(1, rows/cols) · O
    Every other group takes AdamW's step (adam_update), with its own lr, betas, eps and weight_decay. The defaults
    are torch.optim.Muon's.
    orthogonalize: newton_schulz, or your own version of it (lesson 19 trains with yours).
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.1, ns_steps: int = 5, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, orthogonalize=newton_schulz):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or ns_steps < 1:
            raise ValueError(f"need lr > 0, 0 <= momentum < 1, weight_decay >= 0, ns_steps >= 1; "
                             f"got {lr}, {momentum}, {weight_decay}, {ns_steps}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                      ns_steps=ns_steps, betas=betas, eps=eps, use_muon=True))
        self.orthogonalize = orthogonalize
        for group in self.param_groups:
            if group["use_muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon steps matrices only: put biases, norms and any other parameter that is not "
                                 "2-D in a group with use_muon=False")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not group["use_muon"]:
                    adam_update(p, self.state[p], group, decoupled=True)
                    continue
                lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                B = state["momentum_buffer"]
                B.lerp_(p.grad, 1 - mu)
                U = p.grad.lerp(B, mu) if group["nesterov"] else B
                O = self.orthogonalize(U, group["ns_steps"])
                p.mul_(1 - lr * wd)
                p.add_(O, alpha=-lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))


def muon_groups(model: nn.Module, lr: float, adam_lr: float, weight_decay: float = 0.0) -> list[dict]:
    """Muon for the matrices inside the transformer's blocks; AdamW for the embeddings and the head (a lookup and
    a readout, not maps between hidden vectors), and for biases and norms (not matrices). Decay as param_groups."""
    muon, adam_decay, adam_rest = [], [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() == 2 and ".h." in f".{name}":
            muon.append(p)
        else:
            (adam_decay if p.dim() >= 2 else adam_rest).append(p)
    return [dict(params=muon, lr=lr, weight_decay=weight_decay, use_muon=True),
            dict(params=adam_decay, lr=adam_lr, weight_decay=weight_decay, use_muon=False),
            dict(params=adam_rest, lr=adam_lr, weight_decay=0.0, use_muon=False)]


def max_divergence(make_a, make_b, shapes=((7,), (5, 3), (4, 6, 2)), steps: int = 25, seed: int = 0) -> float:
    """Largest |θ_a − θ_b| over `steps` steps of two optimizers fed identical parameters and random
    gradients (magnitudes spread over 1e-3..10). make_a/make_b: params -> optimizer."""
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=g) for s in shapes]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    opt_a, opt_b = make_a(a), make_b(b)
    worst = 0.0
    for _ in range(steps):
        for p, q in zip(a, b):
            grad = torch.randn(p.shape, generator=g) * 10 ** torch.randint(-3, 2, (1,), generator=g).item()
            p.grad, q.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
        worst = max(worst, max((p - q).abs().max().item() for p, q in zip(a, b)))
    return worst


def state_bytes(optimizer: Optimizer) -> int:
    """Bytes held in the optimizer's state tensors (moments, factors, buffers; step tensors count too)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings (dim >= 2) decay; biases and LayerNorm gains (dim < 2) do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def mup_groups(model: nn.Module, lr: float, weight_decay: float) -> list[dict]:
    """AdamW's groups under µP: the matrices inside the blocks step at lr / width_mult (an Adam step moves every
    entry by about lr, and a hidden vector sums fan_in of them); the embeddings, the head (whose logits the model
    divides by width_mult), biases and norms at lr. Decay as param_groups. Standard models get param_groups at lr."""
    mult = model.config.width_mult
    hidden = {id(p) for name, p in model.named_parameters() if p.dim() == 2 and ".h." in f".{name}"}
    groups = []
    for group in param_groups(model, weight_decay):
        inner = [p for p in group["params"] if id(p) in hidden]
        outer = [p for p in group["params"] if id(p) not in hidden]
        groups += [dict(group, params=inner, lr=lr / mult), dict(group, params=outer, lr=lr)]
    return [g for g in groups if g["params"]]
