"""Lesson 10's rank functions: tensor and sequence parallelism against one rank, their collectives and bytes,
activation memory per rank, and dp × tp training (FSDP2 over dp, DTensor TP within) against one process.

Launched from notebooks/10_tensor_parallel.ipynb through lessons/tensor_parallel/, or by hand:

    $ python -m labtools.parallel make-job lessons.tensor_parallel.ranks:parity '{}' --run-dir RUN
    $ torchrun --standalone --nproc-per-node 2 -m labtools.parallel.worker RUN/job.json

Each function returns a dataclass defined beside it (`lesson_run` a TensorParallelRun holding them all).
"""

import copy
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from labtools.keys import Key
from labtools.memory import saved_activations
from labtools.parallel.comm import CollectiveCounter, WireBytes
from labtools.parallel.mesh import make_mesh
from labtools.parallel.tensor import apply_tensor_parallel, full, gather_written_out, tensor_parallel_written_out
from labtools.parallel.toolkit import (build_gpt, device, global_batch, mean_over_ranks, report_progress, world_size)
from lessons.tensor_parallel import Settings

# DTensor's input hooks warn that a backward hook fires for outputs whose inputs need no gradient (token ids)
warnings.filterwarnings("ignore", message="Full backward hook is firing")

WIRE_REPEATS = 10


class Version(Key):
    """The versions of tensor parallelism the lesson runs against one rank."""
    WRITTEN_OUT = "written-out"  # Megatron's f and g written out (labtools.parallel.tensor)
    DTENSOR = "dtensor"          # DTensor's ColwiseParallel / RowwiseParallel plan
    DTENSOR_SP = "dtensor+sp"    # the same plan with sequence parallelism


class Split(Key):
    """How the model is split over the ranks when its activations are measured."""
    NONE = "none"    # the whole model on each rank
    TP = "tp"        # DTensor tensor parallelism
    TP_SP = "tp+sp"  # DTensor tensor parallelism with sequence parallelism


def _mesh():
    return init_device_mesh(device().type, (world_size(),))


def _max_diff(a: dict, b: dict) -> float:
    return max((full(a[k]) - b[k]).abs().max().item() for k in b)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p.grad) for n, p in module.named_parameters()}


def _module_parity(ref: torch.nn.Module, x: torch.Tensor, R: torch.Tensor, plan: dict) -> dict[Version, float]:
    """A sub-module (MLP or attention) written out and with DTensor against the whole one: output, input
    gradient and parameter gradients, for the loss sum(out · R)."""
    from torch.distributed.tensor.parallel import parallelize_module
    xr = x.clone().requires_grad_()
    out = ref(xr)
    (out * R).sum().backward()
    want = {"out": out.detach(), "dx": xr.grad, **_grads(ref)}
    res = {}
    # written out
    mod = copy.deepcopy(ref)
    mod.zero_grad(set_to_none=True)
    for name, cls in plan["written"].items():
        setattr(mod, name, cls(getattr(mod, name)))
    xw = x.clone().requires_grad_()
    out = mod(xw)
    (out * R).sum().backward()
    got = {"out": out.detach(), "dx": xw.grad}
    for name in plan["written"]:
        got.update({f"{name}.{k}": v for k, v in gather_written_out(getattr(mod, name)).items()})
    res[Version.WRITTEN_OUT] = _max_diff(got, {k: want[k] for k in got})
    # DTensor
    mod = copy.deepcopy(ref)
    mod.zero_grad(set_to_none=True)
    parallelize_module(mod, _mesh(), plan["dtensor"])
    xd = x.clone().requires_grad_()
    out = mod(xd)
    (full(out) * R).sum().backward()
    res[Version.DTENSOR] = _max_diff({"out": full(out).detach(), "dx": xd.grad, **_grads(mod)}, want)
    return res


@dataclass(frozen=True)
class ParityResult:
    """Max |Δ| of outputs and gradients on this rank against the same module on one rank, per version."""
    mlp: dict[Version, float]        # block 0's MLP: written out and DTensor
    attention: dict[Version, float]  # block 0's attention: written out and DTensor
    gpt: dict[Version, float]        # the whole GPT (logits and every gradient): every version

    def worst(self) -> float:
        """The largest difference of any module and version."""
        return max(v for part in (self.mlp, self.attention, self.gpt) for v in part.values())


def parity(job: Settings) -> ParityResult:
    """Outputs and gradients of the MLP, attention and the whole GPT split over this launch's ranks (written out
    and DTensor; the GPT also with sequence parallelism) against the same module on one rank (max |Δ|)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from labtools.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    g = torch.Generator().manual_seed(job.seed + 7)
    x = torch.randn(job.batch_size, job.block_size, job.n_embd, generator=g).to(device())
    R = torch.randn(job.batch_size, job.block_size, job.n_embd, generator=g).to(device())
    block = build_gpt(job).transformer.h[0]
    mlp = _module_parity(block.mlp, x, R, {
        "written": {"c_fc": ColumnParallelLinear, "c_proj": RowParallelLinear},
        "dtensor": {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()}})
    attention = _module_parity(block.attn, x, R, {
        "written": {"c_attn": ColumnParallelLinear, "c_proj": RowParallelLinear},
        "dtensor": {"c_attn": ColwiseParallel(), "c_proj": RowwiseParallel()}})
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), job.batch_size)
    ref = build_gpt(job)
    logits, loss = ref(X, Y)
    loss.backward()
    want = {"logits": logits.detach(), **_grads(ref)}
    gpt = {}
    for variant in Version:
        model = _split_gpt(job, variant)
        logits, loss = model(X, Y)
        loss.backward()
        if variant == Version.WRITTEN_OUT:
            got = {"logits": logits.detach()}
            for name, mod in model.named_modules():
                if isinstance(mod, (ColumnParallelLinear, RowParallelLinear)):
                    got.update({f"{name}.{k}": v for k, v in gather_written_out(mod).items()})
            for name, p in model.named_parameters():
                if name.rsplit(".", 1)[0] not in {n for n, m in model.named_modules()
                                                  if isinstance(m, (ColumnParallelLinear, RowParallelLinear))}:
                    got[name] = p.grad
        else:
            got = {"logits": full(logits).detach(), **_grads(model)}
        gpt[variant] = _max_diff(got, {k: want[k] for k in got})
        report_progress(len(gpt), len(Version), variant)
    return ParityResult(mlp=mlp, attention=attention, gpt=gpt)


def _split_gpt(job: Settings, variant: Version):
    """The lesson GPT split over this launch's ranks: Megatron's layers written out, or a DTensor plan (+ SP)."""
    model = build_gpt(job)
    if variant == Version.WRITTEN_OUT:
        tensor_parallel_written_out(model)
    else:
        apply_tensor_parallel(model, _mesh(), sequence_parallel=variant == Version.DTENSOR_SP)
    return model


def _one_step(model, X, Y):
    _, loss = model(X, Y)
    loss.backward()


@dataclass(frozen=True)
class VersionComm:
    """One forward + backward of the whole GPT under one version: the collectives it called and what they sent."""
    calls: dict[str, int]              # torch's collective name -> calls
    input_bytes: dict[str, int]        # torch's collective name -> bytes of this rank's inputs (CollectiveCounter)
    wire: int | None                   # bytes over the loopback interface (None: no counter here, or NCCL)


@dataclass(frozen=True)
class CollectiveWire:
    """Bytes on the wire for one collective of b·s·h bytes, alone (the mean of WIRE_REPEATS; None: no counter)."""
    all_reduce: float | None
    all_gather: float | None
    reduce_scatter: float | None


@dataclass(frozen=True)
class CommResult:
    """What each version of tensor parallelism sends, and what gloo sends for one collective alone."""
    versions: dict[Version, VersionComm]
    bsh_bytes: int                     # one activation, b·s·h·4
    collective_wire: CollectiveWire


def comm(job: Settings) -> CommResult:
    """One forward + backward of the whole GPT per variant: collectives (calls, and the bytes of their
    tensors for the written-out version), and the bytes that crossed the loopback interface."""
    from torch.distributed.tensor.debug import CommDebugMode
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), job.batch_size)
    versions = {}
    for variant in Version:
        model = _split_gpt(job, variant)
        _one_step(model, X, Y)  # warm-up
        model.zero_grad(set_to_none=True)
        counter, debug = CollectiveCounter(), CommDebugMode()
        with counter, debug, WireBytes() as wire:
            _one_step(model, X, Y)
        calls = {str(k).split(".")[-1]: v for k, v in debug.get_comm_counts().items()}
        versions[variant] = VersionComm(calls=calls or dict(counter.calls), input_bytes=dict(counter.bytes),
                                        wire=wire.bytes)
    M = job.batch_size * job.block_size * job.n_embd * 4
    # one collective of M bytes each, alone, on the wire: what gloo itself sends for it (the mean of WIRE_REPEATS:
    # a single 64 KB collective is small enough for other local traffic to move it by 15%, seen once in ~20 runs)
    alone = {}  # collective -> bytes on the wire for one of M bytes
    x = torch.ones(M // 4, device=device())
    shard = x[: M // 4 // world_size()]
    for name, fn in (("all_reduce", lambda: dist.all_reduce(x.clone())),
                     ("all_gather", lambda: dist.all_gather_into_tensor(x.clone(), shard.clone())),
                     ("reduce_scatter", lambda: dist.reduce_scatter_tensor(shard.clone(), x.clone()))):
        fn()  # warm-up
        with WireBytes() as wire:
            for _ in range(WIRE_REPEATS):
                fn()
        alone[name] = None if wire.bytes is None else wire.bytes / WIRE_REPEATS
    return CommResult(versions=versions, bsh_bytes=M, collective_wire=CollectiveWire(**alone))


def _param_tensors(model) -> list[torch.Tensor]:
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]


@dataclass(frozen=True)
class MemoryResult:
    """Bytes of activations this rank saved for backward in one forward of the whole GPT, per split."""
    saved: dict[Split, int]


def memory(job: Settings) -> MemoryResult:
    """Bytes of activations each rank saves for backward in one forward: the whole model, TP, TP + SP."""
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed), job.batch_size)
    saved_bytes = {}
    for split in Split:
        model = build_gpt(job)
        if split != Split.NONE:
            apply_tensor_parallel(model, _mesh(), sequence_parallel=split == Split.TP_SP)
        saved, _ = saved_activations(lambda: model(X, Y), exclude=_param_tensors(model))
        saved_bytes[split] = sum(s.nbytes for s in saved)
    return MemoryResult(saved=saved_bytes)


@dataclass(frozen=True)
class TrainingResult:
    """Training against one process: the loss per AdamW step (the mean over ranks), and the first step's gradients
    of the blocks' ln_1 gathered whole ({parameter name: its gradient})."""
    losses: list[float]
    first_grads_ln_1: dict[str, list[float]]


def two_d(job: Settings) -> TrainingResult:
    """dp × tp on this launch's ranks: TP within each group of tp ranks (DTensor), FSDP2 over the dp groups;
    job.steps AdamW steps on the same batches as one process (each dp replica its rows). The loss per step,
    and the first step's gradients gathered whole."""
    tp = world_size() // job.dp
    mesh = make_mesh(dp=job.dp, tp=tp)
    model = build_gpt(job)
    apply_tensor_parallel(model, mesh["tp"])
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(job.seed + 1)
    dp_rank, rows = mesh["dp"].get_local_rank(), job.batch_size // job.dp
    losses, first = [], None
    for step in range(job.steps):
        X, Y = global_batch(job, g, job.batch_size)
        _, loss = model(X[dp_rank * rows:(dp_rank + 1) * rows], Y[dp_rank * rows:(dp_rank + 1) * rows])
        loss.backward()
        if step == 0:
            first = {n: full(p.grad).tolist() for n, p in model.named_parameters() if "ln_1" in n}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(mean_over_ranks(loss.item()))
        report_progress(step + 1, job.steps, f"dp {job.dp} × tp {tp}")
    return TrainingResult(losses=losses, first_grads_ln_1=first)


def single_process(job: Settings) -> TrainingResult:
    """The same steps as two_d in one process on the whole batch (run by the launcher)."""
    model = build_gpt(job)
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses, first = [], None
    for step in range(job.steps):
        X, Y = global_batch(job, g, job.batch_size)
        _, loss = model(X, Y)
        loss.backward()
        if step == 0:
            first = {n: p.grad.tolist() for n, p in model.named_parameters() if "ln_1" in n}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return TrainingResult(losses=losses, first_grads_ln_1=first)


@dataclass(frozen=True)
class TensorParallelRun:
    """Everything one rank measured at one tensor-parallel size (lesson_run); None where the launch did not run it."""
    parity: ParityResult | None    # None on one rank
    comm: CommResult | None        # None on one rank
    memory: MemoryResult
    two_d: TrainingResult | None   # dp × tp training, where job.dp > 1


def lesson_run(job: Settings) -> TensorParallelRun:
    """Parity, collectives and memory at this launch's tensor-parallel size, in one launch; with job.dp > 1, then
    dp × tp training on the same ranks (two_d)."""
    if dist.get_world_size() == 1:
        return TensorParallelRun(parity=None, comm=None, memory=memory(job), two_d=None)
    return TensorParallelRun(parity=parity(job), comm=comm(job), memory=memory(job),
                             two_d=two_d(job) if job.dp > 1 else None)
