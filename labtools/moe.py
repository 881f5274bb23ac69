"""Mixture of experts: a top-k router with a capacity, expert MLPs, the load-balancing and router z losses, and an
MoE GPT made from the lab's GPT by giving every block experts in place of its MLP.

    route(logits, k, capacity)       each token's k experts, gates and whether it fits the expert's capacity
    capacity(tokens, E, k, factor)   ⌈factor · tokens · k / E⌉ slots per expert
    balance_loss(routing)            Switch Transformer's E · Σ_e f_e · P_e (1 when perfectly balanced)
    z_loss(logits)                   ST-MoE's mean of logsumexp(logits)²
    MoEMLP                           router + E experts; keeps the last step's routing for the lesson to read
    moe_gpt(config, E, k, factor)    a labtools.model.GPT whose blocks hold MoEMLPs
    aux_losses(model)                the balance and z losses of the model's last forward, summed over blocks

Written by hand because the lesson teaches it; nothing here is distributed (lessons/mixture_of_experts runs the
experts on ranks). Introduced in notebooks/15_mixture_of_experts.ipynb.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from labtools.model import GPT, MLP, GPTConfig
from labtools.validate import check_range


@dataclass
class Routing:
    expert: torch.Tensor   # (T, k) the chosen experts, best first
    gate: torch.Tensor     # (T, k) each choice's weight in the token's output
    kept: torch.Tensor     # (T, k) bool: the choice fits its expert's capacity (else the token skips that expert)
    probs: torch.Tensor    # (T, E) the router's softmax over all experts
    logits: torch.Tensor   # (T, E)

    @property
    def n_experts(self) -> int:
        return self.probs.size(-1)

    def load(self) -> torch.Tensor:
        """Assignments each expert received (before capacity), (E,)."""
        return torch.bincount(self.expert.reshape(-1), minlength=self.n_experts)

    def dropped(self) -> int:
        """Assignments beyond their expert's capacity."""
        return int((~self.kept).sum())


def capacity(tokens: int, n_experts: int, k: int, factor: float) -> int:
    """Slots per expert: ⌈factor · tokens · k / E⌉ (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021)."""
    check_range("tokens", tokens, 0, None, int)
    check_range("n_experts", n_experts, 1, None, int)
    check_range("k", k, 1, n_experts, int)
    check_range("factor", factor, 0, None, open_lo=True)
    return math.ceil(factor * tokens * k / n_experts)


def route(logits: torch.Tensor, k: int, capacity: int) -> Routing:
    """Top-k routing of T tokens over E experts from the router's logits (T, E).

    Gates: the softmax probabilities of the chosen experts; with k > 1 renormalised to sum to 1 over them (Mixtral,
    Jiang et al. 2024), with k = 1 the probability itself, so that the router still learns from the loss (Switch).
    Capacity: each expert takes at most `capacity` assignments, first choices before second choices, earlier tokens
    first; the rest are dropped (the token's residual stream passes them by)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (tokens, experts), got shape {tuple(logits.shape)}")
    check_range("k", k, 1, logits.size(1), int)  # of the E experts
    check_range("capacity", capacity, 1, None, int)
    T, E = logits.shape
    probs = F.softmax(logits, dim=-1)
    top_p, expert = probs.topk(k, dim=-1)
    gate = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    order = expert.t().reshape(-1)                       # choice-major: every first choice, then every second
    onehot = F.one_hot(order, E)
    position = (onehot.cumsum(0) - 1).gather(1, order[:, None]).squeeze(1)  # place in that expert's queue
    kept = (position < capacity).reshape(k, T).t()
    return Routing(expert, gate, kept, probs, logits)


def balance_loss(r: Routing) -> torch.Tensor:
    """E · Σ_e f_e · P_e: f_e the share of assignments routed to e (not differentiable), P_e the mean router
    probability of e (differentiable). 1 when both are uniform; it grows as tokens crowd onto a few experts
    (Switch Transformer, Fedus et al. 2021, eq. 4, with top-k assignments counted)."""
    f = r.load().to(r.probs.dtype) / r.expert.numel()
    return r.n_experts * (f * r.probs.mean(0)).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean of logsumexp(logits)² over tokens: keeps the router's logits small (ST-MoE, Zoph et al. 2022)."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def dispatch(r: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept assignments grouped by expert: (token index, gate, count per expert), experts in order."""
    token = torch.arange(r.expert.size(0), device=r.expert.device)[:, None].expand_as(r.expert)
    expert, token, gate = r.expert[r.kept], token[r.kept], r.gate[r.kept]
    order = torch.argsort(expert, stable=True)
    return token[order], gate[order], torch.bincount(expert, minlength=r.n_experts)


class MoEMLP(nn.Module):
    """A router and E expert MLPs (each the lab's MLP, width 4·n_embd) in place of a block's MLP. Each token goes
    through its k experts (those with room), weighted by its gates. The last forward's routing is kept in
    self.routing, its balance and z losses in self.aux."""

    def __init__(self, config: GPTConfig, n_experts: int, top_k: int, capacity_factor: float):
        super().__init__()
        if not isinstance(n_experts, int) or n_experts < 1:
            raise ValueError(f"n_experts must be an int >= 1, got {n_experts!r}")
        if not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be an int in [1, n_experts = {n_experts}], got {top_k!r}")
        if not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = nn.Linear(config.n_embd, n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(config) for _ in range(n_experts))
        self.routing: Routing | None = None
        self.aux: dict[str, torch.Tensor] = {}
        self.route = route  # (logits, k, capacity) -> Routing; lesson 15 puts a learner's routing here

    def extra_repr(self) -> str:
        return "" if self.route is route else f"route={getattr(self.route, '__name__', self.route)}"

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        r = self.route(self.router(flat), self.top_k, capacity(flat.size(0), self.n_experts, self.top_k,
                                                                self.capacity_factor))
        token, gate, counts = dispatch(r)
        out = torch.zeros_like(flat)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                idx = token[start:start + n]
                out = out.index_add(0, idx, self.experts[e](flat[idx]) * gate[start:start + n, None])
            start += n
        self.routing = r
        self.aux = {"balance": balance_loss(r), "z": z_loss(r.logits)}
        return out.reshape(shape)


def moe_gpt(config: GPTConfig, n_experts: int, top_k: int, capacity_factor: float = 1.25) -> GPT:
    """The lab's GPT with an MoEMLP in every block, initialised as GPT initialises its own layers (normal 0.02, the
    residual projections scaled by 1/√(2L))."""
    model = GPT(config)
    for block in model.transformer.h:
        block.mlp = MoEMLP(config, n_experts, top_k, capacity_factor)
        block.mlp.apply(model._init_weights)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
    return model


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def aux_losses(model: nn.Module) -> dict[str, torch.Tensor]:
    """The balance and z losses of the model's last forward, averaged over its MoE layers."""
    layers = moe_layers(model)
    if not layers or not layers[0].aux:
        raise ValueError("no MoE layer has run a forward yet")
    return {k: torch.stack([m.aux[k] for m in layers]).mean() for k in layers[0].aux}


def active_params(model: GPT) -> int:
    """Parameters one token uses: all but the experts it is not routed to (k of E per MoE layer)."""
    total = model.num_params()
    for m in moe_layers(model):
        per_expert = sum(p.numel() for p in m.experts[0].parameters())
        total -= (m.n_experts - m.top_k) * per_expert
    return total
