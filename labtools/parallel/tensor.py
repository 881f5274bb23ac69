"""Tensor and sequence parallelism for the lab's GPT: Megatron's split written out, then the same with DTensor.

    tensor_parallel_written_out(model, group)    # learning version: nn.Linear -> Column/RowParallelLinear in place
    parallelize_module(model, mesh, tp_plan(model, sequence_parallel=True))   # the real one (DTensor)

Written out (Shoeybi et al. 2019, Megatron-LM §3), for learning. In each block, attention's c_attn and the MLP's
c_fc are split by output columns (each rank computes whole heads / a slice of the 4C hidden units) and their
c_proj by input rows (each rank's partial products add up to the output). Two conjugate functions connect them:
    f  identity forward, all-reduce backward   before a column-parallel linear: every rank needs the whole
                                               input; the input's gradient is the sum of every rank's part
    g  all-reduce forward, identity backward   after a row-parallel linear: the partial outputs add up
Per block and micro-batch: two all-reduces of b·s·h numbers forward (two g) and two backward (two f).
The head-by-head layout of c_attn (labtools/model.py) makes a column shard hold whole heads' q, k and v.

DTensor (tp_plan): ColwiseParallel / RowwiseParallel on the same four linears; with sequence parallelism
(Korthikanti et al. 2022) the LayerNorms run on a sequence shard (SequenceParallel) and each all-reduce becomes
a reduce-scatter (leaving the sequence sharded) plus an all-gather (before the next column-parallel linear).
Embeddings, the final LayerNorm and the head stay replicated. labtools.model knows nothing of this.
Introduced in notebooks/10_tensor_parallel.ipynb.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labtools.model import GPT

# --- written out -------------------------------------------------------------------------------------------------


class _F(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _G(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """This rank's out_features / t rows of a Linear (written out, for learning): y_r = f(x) W_rᵀ + b_r."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        if linear.out_features % t:
            raise ValueError(f"out_features {linear.out_features} must divide by the tensor-parallel size {t}")
        rows = slice(r * linear.out_features // t, (r + 1) * linear.out_features // t)
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = nn.Parameter(linear.bias.detach()[rows].clone()) if linear.bias is not None else None

    def forward(self, x):
        return F.linear(_F.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's in_features / t columns of a Linear (written out, for learning): y = g(x_r W_rᵀ) + b."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        if linear.in_features % t:
            raise ValueError(f"in_features {linear.in_features} must divide by the tensor-parallel size {t}")
        cols = slice(r * linear.in_features // t, (r + 1) * linear.in_features // t)
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None  # added once

    def forward(self, x):
        y = _G.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def check_tensor_parallel(model: GPT, t: int) -> None:
    """ValueError naming the constraint: t must divide the heads (whole heads per rank) and the width."""
    cfg = model.config
    if not isinstance(t, int) or isinstance(t, bool) or t < 1:
        raise ValueError(f"tp must be an int >= 1, got {t!r}")
    if cfg.n_head % t:
        raise ValueError(f"tp must divide the number of heads: {cfg.n_head} heads, tp = {t}")
    if cfg.n_embd % t:
        raise ValueError(f"tp must divide the width: n_embd = {cfg.n_embd}, tp = {t}")


def tensor_parallel_written_out(model: GPT, group=None) -> GPT:
    """Replace each block's four linears by their column/row-parallel shards, in place (weights copied from the
    whole model, so every rank must start from the same one)."""
    check_tensor_parallel(model, dist.get_world_size(group))
    for block in model.transformer.h:
        block.attn.c_attn = ColumnParallelLinear(block.attn.c_attn, group)
        block.attn.c_proj = RowParallelLinear(block.attn.c_proj, group)
        block.mlp.c_fc = ColumnParallelLinear(block.mlp.c_fc, group)
        block.mlp.c_proj = RowParallelLinear(block.mlp.c_proj, group)
    return model


def gather_written_out(module: nn.Module, group=None) -> dict[str, torch.Tensor]:
    """{name: whole tensor} of a written-out parallel linear's parameter gradients (for comparing with one rank)."""
    t = dist.get_world_size(group)
    out = {}
    for name, p in module.named_parameters():
        g = p.grad
        if isinstance(module, ColumnParallelLinear) or (isinstance(module, RowParallelLinear) and name == "weight"):
            parts = [torch.empty_like(g) for _ in range(t)]
            dist.all_gather(parts, g.contiguous(), group=group)
            g = torch.cat(parts, dim=0 if isinstance(module, ColumnParallelLinear) else 1)
        out[name] = g
    return out


# --- DTensor -----------------------------------------------------------------------------------------------------


def tp_plan(model: GPT, sequence_parallel: bool = False) -> dict:
    """The parallelize_module plan for the lab's GPT: column-parallel c_attn and c_fc, row-parallel c_proj; with
    sequence parallelism also the LayerNorms on sequence shards, the residual stream sharded along the sequence
    between blocks (sliced before the first, gathered before ln_f)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel
    plan = {}
    for i in range(len(model.transformer.h)):
        b = f"transformer.h.{i}"
        plan[f"{b}.attn.c_attn"] = ColwiseParallel()
        plan[f"{b}.mlp.c_fc"] = ColwiseParallel()
        if sequence_parallel:
            plan[f"{b}.ln_1"] = SequenceParallel()
            plan[f"{b}.ln_2"] = SequenceParallel()
            for sub in ("attn", "mlp"):  # all-gather the sequence before the column-parallel linear
                plan[f"{b}.{sub}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
                plan[f"{b}.{sub}.c_proj"] = RowwiseParallel(output_layouts=Shard(1))  # reduce-scatter
        else:
            plan[f"{b}.attn.c_proj"] = RowwiseParallel()  # all-reduce
            plan[f"{b}.mlp.c_proj"] = RowwiseParallel()
    if sequence_parallel:
        plan["transformer.h.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                     use_local_output=True)
        plan["transformer.ln_f"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                      use_local_output=True)
    return plan


def apply_tensor_parallel(model: GPT, mesh, sequence_parallel: bool = False) -> GPT:
    """parallelize_module with tp_plan on a 1-D mesh (or the "tp" dimension of a larger one)."""
    import warnings

    from torch.distributed.tensor.parallel import parallelize_module
    check_tensor_parallel(model, mesh.size())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return parallelize_module(model, mesh, tp_plan(model, sequence_parallel))


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered to a whole tensor; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
