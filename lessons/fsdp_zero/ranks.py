"""Lesson 08's rank functions: each rank's bytes under DDP, ZeRO-1/2/3 and FSDP1, the collectives of a step,
and FSDP trained against DDP.

Launched from notebooks/08_fsdp_zero.ipynb through lessons/fsdp_zero/, or by hand (see labtools/parallel/__main__.py).
"""

import warnings
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools.keys import Key
from labtools.memory import tensor_bytes
from labtools.optim import AdamW
from labtools.parallel.comm import CollectiveCounter, DDPCommCounter, WireBytes
from labtools.parallel.toolkit import (build_gpt, device, global_batch, rank_rows, report_progress, shard_gpt,
                                       train_step, world_size)
from lessons.fsdp_zero import STRATEGIES, Settings, Strategy


def _wrap(job: Settings, strategy: Strategy, mesh):
    """(the module to call, the module owning the parameters, an optimizer) for one strategy. Optimizers are
    labtools' AdamW, whose state is exactly two tensors per parameter (torch's also keeps a step tensor each)."""
    model = build_gpt(job)
    if strategy is Strategy.DDP:
        return DDP(model), model, AdamW(model.parameters(), lr=job.lr)
    if strategy is Strategy.ZERO1:
        return DDP(model), model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=AdamW, lr=job.lr)
    sharded = shard_gpt(model, mesh, reshard=strategy is not Strategy.ZERO2,
                        mp=strategy is Strategy.ZERO3_BF16)
    return sharded, sharded, AdamW(sharded.parameters(), lr=job.lr)


def _optimizer_bytes(opt) -> int:
    inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt  # ZeRO-1: this rank's partition
    return tensor_bytes(v for s in inner.state.values() for v in s.values() if torch.is_tensor(v))


def _my_batch(job: Settings):
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), world_size() * job.batch_size)
    return rank_rows(X), rank_rows(Y)


class Call(Key):
    """A torch.distributed collective, by the name labtools.parallel.comm.CollectiveCounter counts it under."""
    ALL_REDUCE = "all_reduce"
    ALL_GATHER_INTO_TENSOR = "all_gather_into_tensor"
    REDUCE_SCATTER_TENSOR = "reduce_scatter_tensor"
    ALL_GATHER_SINGLE = "all_gather_single"
    REDUCE_SCATTER_SINGLE = "reduce_scatter_single"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    ALL_TO_ALL_SINGLE = "all_to_all_single"


@dataclass(frozen=True)
class StrategyResult:
    """One strategy on this rank: the bytes of the model states it holds, and the collectives of one step."""
    params: int                    # parameter bytes at rest
    held_after_forward: int        # parameter bytes held between forward and backward
    grads: int                     # gradient bytes
    optimizer: int                 # optimizer state bytes
    calls: dict[Call, int]         # calls in the step
    input_bytes: dict[Call, int]   # bytes this rank handed each collective in the step
    events: list[tuple[str, int]]  # (collective, input bytes) in call order, each phase's (name, 0) before its calls
    wire_bytes: int | None         # bytes on the loopback interface in the step, all ranks; None under NCCL
    partition: list[int] | None = None  # ZeRO-1: the parameters (by index) whose optimizer state this rank keeps


@dataclass(frozen=True)
class ShardingResult:
    """One rank of the sharding run: every strategy's bytes and collectives, and the model's parameter sizes."""
    sizes: list[int]  # each parameter's element count, in the model's order
    strategies: dict[Strategy, StrategyResult]

    @property
    def n_params(self) -> int:
        return sum(self.sizes)

    @property
    def largest_param(self) -> int:
        return max(self.sizes)


def sharding(job: Settings) -> ShardingResult:
    """Per strategy, on this rank: bytes of parameters (at rest, and held between forward and backward),
    gradients and optimizer state, and the collectives of one training step (calls, input bytes)."""
    mesh = init_device_mesh(device().type, (world_size(),))
    X, Y = _my_batch(job)
    sizes = [p.numel() for p in build_gpt(job).parameters()]
    out = {}
    for i, strategy in enumerate(STRATEGIES):
        module, owner, opt = _wrap(job, strategy, mesh)
        ddp_counter = DDPCommCounter()
        if isinstance(module, DDP):
            module.register_comm_hook(None, ddp_counter.hook)
        with WireBytes() as wire, CollectiveCounter() as counter:  # the wire: what gloo really sent, all ranks
            counter.mark("forward")
            _, loss = module(X, Y)
            held = tensor_bytes(owner.parameters())  # between forward and backward
            counter.mark("backward")
            loss.backward()
            grads = tensor_bytes(p.grad for p in owner.parameters())
            counter.mark("optimizer step")
            opt.step()  # ZeRO-1 broadcasts each updated partition from its owner here
        calls = {Call(k): v for k, v in counter.calls.items()}
        sent = {Call(k): v for k, v in counter.bytes.items()}
        if ddp_counter.calls:  # DDP's all-reduces run from C++: counted by its hook instead
            calls[Call.ALL_REDUCE], sent[Call.ALL_REDUCE] = ddp_counter.calls, ddp_counter.bytes
        partition = None
        if isinstance(opt, ZeroRedundancyOptimizer):  # which parameters this rank's partition holds (by index)
            index = {id(p): i for i, p in enumerate(owner.parameters())}
            partition = sorted(index[id(p)] for g in opt.optim.param_groups for p in g["params"])
        out[strategy] = StrategyResult(params=tensor_bytes(owner.parameters()), held_after_forward=held, grads=grads,
                                       optimizer=_optimizer_bytes(opt), calls=calls, input_bytes=sent,
                                       events=counter.events, wire_bytes=wire.bytes, partition=partition)
        report_progress(i + 1, len(STRATEGIES), strategy.short)
    return ShardingResult(sizes=sizes, strategies=out)


class Fsdp1(Key):
    """FSDP1's sharding strategies, by torch's ShardingStrategy names."""
    NO_SHARD = "NO_SHARD"            # every rank holds everything (DDP)
    SHARD_GRAD_OP = "SHARD_GRAD_OP"  # ZeRO-2
    FULL_SHARD = "FULL_SHARD"        # ZeRO-3


@dataclass(frozen=True)
class HeldBytes:
    """Bytes of parameters and gradients on this rank, at rest after a backward."""
    params: int
    grads: int


@dataclass(frozen=True)
class Fsdp1Result:
    """One rank of the FSDP1 run: what it holds under each of FSDP1's sharding strategies."""
    held: dict[Fsdp1, HeldBytes]


def fsdp1(job: Settings) -> Fsdp1Result:
    """FSDP1's sharding strategies (FlatParameter per unit): bytes of parameters and gradients on this rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from labtools.model import Block
    X, Y = _my_batch(job)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # FSDP1 is deprecated in favour of fully_shard
        for name in Fsdp1:
            model = FSDP(build_gpt(job), sharding_strategy=ShardingStrategy[name.value], device_id=device(),
                         auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=False)
            model(X, Y)[1].backward()
            out[name] = HeldBytes(params=tensor_bytes(model.parameters()),
                                  grads=tensor_bytes(p.grad for p in model.parameters()))
    return Fsdp1Result(held=out)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


@dataclass(frozen=True)
class TrainedRun:
    """One way of training: its first step's gradients against one process's on the whole batch, and its losses."""
    grad_max_diff: float  # max |Δg| at the first step
    losses: list[float]   # the global loss per step


@dataclass(frozen=True)
class EquivalenceResult:
    """One rank of FSDP2 (ZeRO-3) and DDP trained on the same data."""
    ddp: TrainedRun
    fsdp: TrainedRun


def equivalence(job: Settings) -> EquivalenceResult:
    """FSDP2 (ZeRO-3) and DDP trained on the same data: losses per step, and the first step's gradients against
    one process on the whole batch (which every rank computes)."""
    N = world_size()
    mesh = init_device_mesh(device().type, (N,))
    X0, Y0 = global_batch(job, torch.Generator().manual_seed(job.seed + 1), N * job.batch_size)  # step 0's batch
    reference = build_gpt(job)
    reference(X0, Y0)[1].backward()
    out = {}
    for name in ("DDP", "FSDP"):
        model = build_gpt(job)
        module = DDP(model) if name == "DDP" else shard_gpt(model, mesh, reshard=True, mp=False)
        module(rank_rows(X0), rank_rows(Y0))[1].backward()  # the first step's gradients, against the reference
        grad_max_diff = max((_full(p.grad) - r.grad).abs().max().item()
                            for p, r in zip(module.parameters(), reference.parameters()))
        module.zero_grad(set_to_none=True)
        opt = AdamW(module.parameters(), lr=job.lr, betas=(0.9, 0.95), weight_decay=0.1)
        g = torch.Generator().manual_seed(job.seed + 1)
        losses = []
        for step in range(job.steps):
            X, Y = global_batch(job, g, N * job.batch_size)
            losses.append(train_step(module, opt, [(rank_rows(X), rank_rows(Y))]))
            report_progress(step + 1 + (job.steps if name == "FSDP" else 0), 2 * job.steps, name)
        out[name] = TrainedRun(grad_max_diff=grad_max_diff, losses=losses)
    return EquivalenceResult(ddp=out["DDP"], fsdp=out["FSDP"])
