"""Lesson 15's rank function: expert parallelism — each of the ep ranks of a group holds E/ep experts; tokens travel
to their experts and back with all-to-all; dp such groups train as data-parallel replicas; output and gradients
against one process; bytes counted and on the wire.

Launched from notebooks/15_mixture_of_experts.ipynb through lessons/mixture_of_experts/experts.py, or by hand:

    $ python -m labtools.parallel make-job lessons.mixture_of_experts.ranks:expert_parallel '{}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 4 -m labtools.parallel.worker RUN/job.json
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from labtools.config import LabConfig
from labtools.model import GPTConfig
from labtools.moe import MoEMLP, route
from labtools.parallel.comm import WireBytes
from labtools.parallel.experts import expert_parallel_forward
from labtools.parallel.toolkit import device, rank, world_size


@dataclass(frozen=True, kw_only=True)
class ExpertJob(LabConfig):
    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float = 2.0
    tokens: int = 64       # tokens per rank
    dp: int = 1            # expert-parallel groups, data-parallel replicas of each other (world = dp × ep)


def layer(job: ExpertJob) -> MoEMLP:
    """The same MoE layer on every rank (seeded): router and all E experts."""
    torch.manual_seed(job.seed)
    cfg = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=job.n_head, n_embd=job.n_embd)
    m = MoEMLP(cfg, job.n_experts, job.top_k, job.capacity_factor).to(device())
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return m


def tokens(job: ExpertJob, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's tokens and the weights R of its loss Σ out · R."""
    g = torch.Generator().manual_seed(job.seed * 1000 + r + 1)
    return (torch.randn(job.tokens, job.n_embd, generator=g).to(device()),
            torch.randn(job.tokens, job.n_embd, generator=g).to(device()))


def expert_forward(m: MoEMLP, x: torch.Tensor, counter: dict, group=None) -> torch.Tensor:
    """The MoE layer with its experts spread over the ranks of `group` (all ranks by default): its rank r holds
    experts [r·E/N, (r+1)·E/N); tokens travel to them and back with all-to-all (labtools.parallel.experts).
    counter["forward"]: the bytes this rank handed the all-to-alls for other ranks (its own rows stay in place)."""
    return expert_parallel_forward(x, m, lambda e: m.experts[e], group, counter)


@dataclass(frozen=True)
class Differences:
    """Largest |difference| from one process's MoE layer, on this rank."""
    out: float       # the layer's output
    x: float         # the gradient of the tokens
    router: float    # the router's gradient, summed over every rank's tokens
    experts: float   # this rank's experts' gradients, summed over every rank's tokens

    def largest(self) -> float:
        return max(self.out, self.x, self.router, self.experts)


@dataclass(frozen=True)
class ExpertRun:
    """One rank's expert-parallel MoE layer: parity with one process, and what it sent."""
    ep_rank: int              # this rank's place in its expert-parallel group
    dp: int                   # expert-parallel groups (data-parallel replicas)
    ep: int                   # ranks per group
    max_diff: Differences
    others_untouched: bool    # no gradient reached the experts this rank does not hold
    bytes: int                # handed to all-to-all for other ranks, one forward and backward
    kept: int                 # token-expert assignments kept within capacity
    wire: int | None          # bytes on the loopback interface, all ranks' (None where it cannot be read)
    load: list[int]           # assignments per expert of this rank's tokens, capacity unlimited


def expert_parallel(job: ExpertJob) -> ExpertRun:
    """One process's MoE layer on this rank's tokens (all experts here) against the expert-parallel one, its groups
    of ep = world / dp ranks data-parallel replicas of each other: output, the gradient of the tokens, and the
    router's and every expert's gradient summed over all ranks' tokens (the data-parallel all-reduce); bytes this
    rank handed all-to-all for one forward and backward, and those on the wire."""
    W = world_size()
    if W % job.dp:
        raise ValueError(f"dp ({job.dp}) must divide the world size ({W})")
    ep = W // job.dp
    mesh = init_device_mesh(device().type, (job.dp, ep), mesh_dim_names=("dp", "ep"))
    ep_group, dp_group = mesh.get_group("ep"), mesh.get_group("dp")
    r = dist.get_rank(ep_group)
    m = layer(job)
    x, R = tokens(job, rank())
    xr = x.clone().requires_grad_()
    ref = m(xr)
    (ref * R).sum().backward()
    ref_x = xr.grad
    ref_router = m.router.weight.grad.clone()
    dist.all_reduce(ref_router)  # every rank's tokens
    local = job.n_experts // ep
    mine = range(r * local, (r + 1) * local)
    ref_experts = torch.cat([p.grad.reshape(-1) for p in m.experts.parameters()])
    dist.all_reduce(ref_experts)  # each expert's gradient over every rank's tokens
    m.zero_grad(set_to_none=True)
    xe = x.clone().requires_grad_()
    counter: dict = {}
    with WireBytes() as wire:
        out = expert_forward(m, xe, counter, ep_group)
        (out * R).sum().backward()
    # data parallelism: the router is on every rank, an expert on one rank of each group
    dist.all_reduce(m.router.weight.grad)
    grads = {e: torch.cat([p.grad.reshape(-1) for p in m.experts[e].parameters()]) for e in mine}
    for g in grads.values():
        dist.all_reduce(g, group=dp_group)
    sizes = [sum(p.numel() for p in e.parameters()) for e in m.experts]
    offsets = [sum(sizes[:e]) for e in range(job.n_experts)]
    expert_diff = max((grads[e] - ref_experts[offsets[e]:offsets[e] + sizes[e]]).abs().max().item() for e in mine)
    untouched = all(p.grad is None for e in range(job.n_experts) if e not in mine for p in m.experts[e].parameters())
    load = torch.bincount(route(m.router(x), job.top_k, 10**9).expert.reshape(-1), minlength=job.n_experts)
    return ExpertRun(ep_rank=r, dp=job.dp, ep=ep,
                     max_diff=Differences(out=(out - ref).abs().max().item(), x=(xe.grad - ref_x).abs().max().item(),
                                          router=(m.router.weight.grad - ref_router).abs().max().item(),
                                          experts=expert_diff),
                     others_untouched=untouched,
                     bytes=2 * counter["forward"],  # backward sends the gradients back the same way
                     kept=counter["kept"], wire=wire.bytes, load=load.tolist())
