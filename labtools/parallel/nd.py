"""One model, every layout: the lab's GPT trained on a mesh of dp × fsdp × tp × pp × cp ranks (or dp × ep, with a
mixture of experts in every block), and held to one process's run.

    dims = ParallelDims(dp=2, tp=2)                          # validated once: dims.check(n_layer=..., ...)
    job = LayoutJob(dp=2, tp=2, steps=3)                     # the lab's GPT, the batch, the steps and the layout
    runs = launch(train, job.dims.world, job)                # each rank's LayoutRun; runs[0] holds the comparison

Each parallelism is one that a lesson taught, composed on one device mesh (torch's DeviceMesh, tp innermost so a
tensor-parallel group stays inside a node's fast links, pp outermost):
    dp    replicated data parallelism: every rank holds whole parameters, gradients all-reduced (lesson 07)
    fsdp  sharded data parallelism, FSDP2 (ZeRO-3): parameters, gradients and AdamW's state split (lesson 08)
    tp    tensor parallelism with DTensor: column/row-parallel linears in every block (lesson 10)
    pp    pipeline parallelism: the blocks cut into pp stages, run by torch's 1F1B schedule (lesson 09)
    cp    context parallelism: the sequence split zig-zag, attention over the lab's ring (lesson 14)
    ep    expert parallelism: each block's experts split, tokens sent to them and back by all-to-all (lesson 15);
          with dp only, here
The data ranks (dp × fsdp × ep) take equal rows of the global batch; the cp ranks of a row take its positions;
tp and pp ranks see the same rows. The gradients of parameters held alike by dp, ep and cp ranks are averaged over
them (forgetting cp is a classic bug: each cp rank's gradient covers only its own positions); FSDP averages over
fsdp. predicted_bytes gives what the planner's arithmetic says each rank sends, to set beside the wire.

The one-process reference is the same GPT (untied embeddings, as a pipeline needs) trained by the same optimizer
(SGD with momentum unless the job says AdamW) on the whole batch, run by rank 0 after the layout's run.
predicted_state_bytes gives the planner's model states per rank, beside the fullest rank's count.
Written here, for the lab: the stage cut, the ring attention's module and the expert-parallel MLP; everything else
is torch's (DeviceMesh, fully_shard, parallelize_module, PipelineStage, Schedule1F1B, all_to_all_single).
Introduced in notebooks/16_plan_a_run.ipynb.
"""

import math
import warnings
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labtools.config import LabConfig
from labtools.model import GPT
from labtools.parallel.context import SeqLayout, positions, ring_attention
from labtools.parallel.experts import expert_parallel_forward
from labtools.parallel.toolkit import device, global_batch, report_progress
from labtools.validate import check_range

# DTensor's input hooks warn that a backward hook fires for outputs whose inputs need no gradient (token ids)
warnings.filterwarnings("ignore", message="Full backward hook is firing")

DIMS = ("pp", "dp", "fsdp", "ep", "cp", "tp")  # the mesh's dimensions, outermost first
PLANTS = ("", "no_cp_reduce", "no_tp_reduce")  # bugs a test plants to show the comparison fails on the right row
# SGD with momentum by default: its update is linear in the gradient, so a layout's rounding stays rounding-sized in
# the weights. Adam divides each gradient by its own running size: where a weight's gradient nearly cancels over the
# batch, rounding in the last bits becomes a visible part of a full step (tests/test_layouts.py shows both).
OPTIMIZERS = ("sgd", "adamw")


@dataclass(frozen=True)
class ParallelDims:
    """The degree of each parallelism; their product is the number of ranks (like torchtitan's ParallelDims)."""
    dp: int = 1    # data parallel, replicated
    fsdp: int = 1  # data parallel, sharded (FSDP2)
    tp: int = 1    # tensor parallel
    pp: int = 1    # pipeline stages
    cp: int = 1    # context parallel
    ep: int = 1    # expert parallel: a mixture of experts' experts split over ep ranks, which take their own rows

    def __post_init__(self):
        for name in DIMS:
            check_range(name, getattr(self, name), 1, 64, int)

    @property
    def world(self) -> int:
        return math.prod(getattr(self, n) for n in DIMS)

    @property
    def data(self) -> int:
        """Ranks that take their own rows of the batch: data parallel (whole or sharded) and expert parallel."""
        return self.dp * self.fsdp * self.ep

    def __str__(self) -> str:
        used = [f"{n} {getattr(self, n)}" for n in ("dp", "fsdp", "tp", "pp", "cp", "ep") if getattr(self, n) > 1]
        return " × ".join(used) or "one process"

    def check(self, *, n_layer: int, n_head: int, n_embd: int, block_size: int, batch_size: int,
              micro_batches: int = 1, world: int | None = None, n_experts: int = 0) -> None:
        """ValueError naming the degree that does not divide what it splits."""
        if self.ep > 1:
            if n_experts % self.ep or n_experts < self.ep:
                raise ValueError(f"ep = {self.ep} must divide the experts ({n_experts}): each rank holds whole ones")
            others = [n for n in ("fsdp", "tp", "pp", "cp") if getattr(self, n) > 1]
            if others:
                raise ValueError(f"ep = {self.ep} combines with dp only here, not with {', '.join(others)}")
        if world is not None and self.world != world:
            raise ValueError(f"the degrees multiply to {self.world} ranks ({self}), not the {world} launched")
        if n_head % self.tp or n_embd % self.tp:
            raise ValueError(f"tp = {self.tp} must divide the heads ({n_head}) and the width ({n_embd})")
        if n_layer % self.pp:
            raise ValueError(f"pp = {self.pp} must divide the layers ({n_layer}): each stage takes whole blocks")
        if block_size % (2 * self.cp):
            raise ValueError(f"cp = {self.cp}: the sequence ({block_size} positions) must split into 2·cp = "
                             f"{2 * self.cp} equal blocks (zig-zag)")
        m = micro_batches if self.pp > 1 else 1
        if batch_size % (self.data * m):
            raise ValueError(f"dp · fsdp · ep = {self.data} ranks × {m} micro-batches must divide the batch "
                             f"({batch_size} rows)")


@dataclass(frozen=True, kw_only=True)
class LayoutJob(LabConfig):
    """A layout's run: the lab's GPT and batch (LabConfig: batch_size is the global batch), its degrees, and the
    micro-batches of a pipeline. plant: a bug to plant (tests only)."""
    n_head: int = 4
    batch_size: int = 8
    steps: int = 3
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    n_experts: int = 0   # a mixture of experts in every block (lesson 15) when > 0; 0: the dense GPT
    top_k: int = 2
    micro_batches: int = 2
    lr: float = 0.1
    optimizer: str = "sgd"
    plant: str = ""

    def __post_init__(self):
        super().__post_init__()
        check_range("micro_batches", self.micro_batches, 1, 1024, int)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.plant not in PLANTS:
            raise ValueError(f"plant must be one of {PLANTS}, got {self.plant!r}")
        check_range("n_experts", self.n_experts, 0, 256, int)
        if self.n_experts:
            check_range("top_k", self.top_k, 1, self.n_experts, int)
        self.dims.check(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size,
                        batch_size=self.batch_size, micro_batches=self.micro_batches, n_experts=self.n_experts)

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(**{n: getattr(self, n) for n in DIMS})


@dataclass
class LayoutRun:
    """What a rank saw. Rank 0 also holds the one-process run and the comparison; the others leave them empty."""
    layout: str
    losses: list[float]                 # the global batch's mean loss per step (every rank: the same)
    reference: list[float] = field(default_factory=list)  # one process, the same steps
    loss_rel: float = math.nan          # largest |Δloss| / loss over the steps
    param_rel: float = math.nan         # largest max|Δw| / max|w| over the parameters after the last step
    worst_param: str = ""               # the parameter where param_rel is reached
    params: int = 0                     # parameters compared (all of the model's)
    wire_bytes: float | None = None     # bytes each rank put on the wire per step (gloo on one machine; None: NCCL)
    state_bytes: float = 0.0            # model states of the fullest rank: its weights, gradients, optimizer state


@dataclass(frozen=True)
class Layouts:
    """Layouts of one number of ranks to train one after another in one launch (train_each)."""
    jobs: tuple[LayoutJob, ...]

    def __post_init__(self):
        if not self.jobs:
            raise ValueError("Layouts needs at least one LayoutJob")
        worlds = {j.dims.world for j in self.jobs}
        if len(worlds) > 1:
            raise ValueError(f"one launch has one number of ranks; these layouts need {sorted(worlds)}")

    @property
    def world(self) -> int:
        return self.jobs[0].dims.world


@dataclass
class LayoutRuns:
    runs: list[LayoutRun]


# --- the model cut for a layout -------------------------------------------------------------------------------


class Stage(nn.Module):
    """The blocks [first, last) of a GPT, with the embeddings if it starts the model and the final LayerNorm and
    head if it ends it; its parameters keep the GPT's names (transformer.h.3.attn.c_attn.weight). pos: the
    positions of the sequence this rank holds (all of them without context parallelism)."""

    def __init__(self, gpt: GPT, index: int, n: int, pos: torch.Tensor):
        super().__init__()
        L = gpt.config.n_layer // n
        self.is_first, self.is_last = index == 0, index == n - 1
        parts = {"h": nn.ModuleDict({str(i): gpt.transformer.h[i] for i in range(index * L, (index + 1) * L)})}
        if self.is_first:
            parts.update(wte=gpt.transformer.wte, wpe=gpt.transformer.wpe)
        if self.is_last:
            parts.update(ln_f=gpt.transformer.ln_f)
            self.lm_head = gpt.lm_head
        self.transformer = nn.ModuleDict(parts)
        self.register_buffer("pos", pos, persistent=False)

    def forward(self, x):
        if self.is_first:  # token ids (B, T) at positions pos -> residual stream (B, T, C)
            x = self.transformer.wte(x) + self.transformer.wpe(self.pos)
        for block in self.transformer.h.values():
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.transformer.ln_f(x))
        return x


class RingSelfAttention(nn.Module):
    """A block's attention with its queries, keys and values at this rank's positions, attending the whole
    sequence over the ring of cp ranks (labtools.parallel.context); the linears are the block's own (split by
    tensor parallelism where it is on: then only this rank's heads)."""

    def __init__(self, attn: nn.Module, pos: torch.Tensor, group):
        super().__init__()
        self.c_attn, self.c_proj, self.head_size = attn.c_attn, attn.c_proj, attn.head_size
        self.register_buffer("pos", pos, persistent=False)
        self.group = group

    def forward(self, x):
        B, T, _ = x.size()
        qkv = self.c_attn(x)
        nh = qkv.size(-1) // (3 * self.head_size)
        q, k, v = qkv.view(B, T, nh, 3, self.head_size).permute(3, 0, 2, 1, 4).unbind(0)  # each (B, nh, T, hs)
        y = ring_attention(q, k, v, self.pos, blocks=2, group=self.group)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * self.head_size))


class ExpertParallelMLP(nn.Module):
    """A block's mixture of experts with only this rank's experts kept, named as in the whole model
    (mlp.experts.3.c_fc.weight, mlp.router.weight), tokens sent to the others' over the ep ranks
    (labtools.parallel.experts)."""

    def __init__(self, moe: nn.Module, group):
        super().__init__()
        n, r = dist.get_world_size(group), dist.get_rank(group)
        local = moe.n_experts // n
        self.n_experts, self.top_k, self.capacity_factor, self.route = (moe.n_experts, moe.top_k,
                                                                        moe.capacity_factor, moe.route)
        self.router, self.group, self.routing = moe.router, group, None
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in range(r * local, (r + 1) * local)})

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        return expert_parallel_forward(flat, self, lambda e: self.experts[str(e)], self.group).reshape(shape)


def build_gpt_for(job: LayoutJob, on=None) -> GPT:
    """The job's GPT, the same wherever it is built (seeded; on this rank's device, or on `on`, e.g. "meta" to count
    it): untied embeddings (a pipeline needs them), no biases, and with n_experts a mixture of experts in every block
    whose capacity never drops a token (k·capacity_factor = E), so that routing each rank's tokens apart keeps every
    assignment, as routing the whole batch at once does."""
    from labtools.config import gpt_config
    from labtools.moe import moe_gpt
    if on != "meta":  # counting it leaves the caller's random state alone
        torch.manual_seed(job.seed)
    cfg = gpt_config(job, tie_embeddings=False, bias=False)
    with torch.device(on or device()):
        if not job.n_experts:
            return GPT(cfg)
        return moe_gpt(cfg, job.n_experts, job.top_k, capacity_factor=job.n_experts / job.top_k)


def _tp_plan(gpt: GPT, plant: str) -> dict:
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {}
    for i in range(gpt.config.n_layer):
        for sub, up in (("attn", "c_attn"), ("mlp", "c_fc")):
            plan[f"transformer.h.{i}.{sub}.{up}"] = ColwiseParallel()
            # the planted bug: the row-parallel output left as partial sums, never all-reduced
            plan[f"transformer.h.{i}.{sub}.c_proj"] = (RowwiseParallel(output_layouts=Partial())
                                                       if plant == "no_tp_reduce" else RowwiseParallel())
    return plan


def _mesh(dims: ParallelDims):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device().type, tuple(getattr(dims, n) for n in DIMS), mesh_dim_names=DIMS)


def build_stage(job: LayoutJob, mesh) -> Stage:
    """This rank's part of the GPT under the job's layout: tensor parallelism on the whole model, then the ring in
    every attention, then the cut into its pipeline stage, then FSDP2 over the fsdp ranks."""
    from torch.distributed.tensor.parallel import parallelize_module
    dims = job.dims
    gpt = build_gpt_for(job)
    if dims.ep > 1:
        for block in gpt.transformer.h:
            block.mlp = ExpertParallelMLP(block.mlp, mesh["ep"].get_group())
    if dims.tp > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            parallelize_module(gpt, mesh["tp"], _tp_plan(gpt, job.plant))
    cp_rank = mesh["cp"].get_local_rank()
    pos = positions(job.block_size, dims.cp, cp_rank, SeqLayout.ZIGZAG).to(device())
    if dims.cp > 1:
        for block in gpt.transformer.h:
            block.attn = RingSelfAttention(block.attn, pos, mesh["cp"].get_group())
    stage = Stage(gpt, mesh["pp"].get_local_rank(), dims.pp, pos)
    if dims.fsdp > 1:
        from torch.distributed.fsdp import fully_shard
        for block in stage.transformer.h.values():
            fully_shard(block, mesh=mesh["fsdp"])
        fully_shard(stage, mesh=mesh["fsdp"])
    return stage


def _group(mesh, names: tuple[str, ...]):
    """(process group, size) of the ranks along the mesh dimensions `names` of size > 1; (None, 1) if none."""
    names = tuple(n for n in names if mesh[n].size() > 1)
    if not names:
        return None, 1
    sub = mesh[names] if len(names) > 1 else mesh[names[0]]
    if len(names) > 1:
        sub = sub._flatten("_".join(names))
    return sub.get_group(), sub.size()


def _average_gradients(stage: nn.Module, job: LayoutJob, mesh) -> None:
    """Average the gradients of parameters held alike by several ranks: over dp, ep and cp for the dense ones
    (the planted bug leaves cp out), over dp and cp for an expert, whose gradient already sums every ep rank's
    tokens (it came back through the all-to-all) and so is divided by ep as well."""
    dense = ("dp", "ep") if job.plant == "no_cp_reduce" else ("dp", "ep", "cp")
    groups = {False: _group(mesh, dense), True: _group(mesh, ("dp", "cp"))}
    for name, p in stage.named_parameters():
        if p.grad is None:  # an expert none of this rank's tokens chose: its peers' gradients still arrive
            p.grad = torch.zeros_like(p)
        expert = ".experts." in name
        group, size = groups[expert]
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        if group is not None:
            dist.all_reduce(local, group=group)
        local.div_(size * (job.ep if expert else 1))


def _rows_and_positions(job: LayoutJob, mesh, X: torch.Tensor, Y: torch.Tensor, pos: torch.Tensor):
    d = (mesh["dp"].get_local_rank() * job.fsdp + mesh["fsdp"].get_local_rank()) * job.ep + mesh["ep"].get_local_rank()
    n = job.batch_size // job.dims.data
    return X[d * n:(d + 1) * n][:, pos], Y[d * n:(d + 1) * n][:, pos]


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def _optimizer(params, job: LayoutJob) -> torch.optim.Optimizer:
    # one tensor at a time: a model split by tensor parallelism alone mixes DTensors and plain tensors
    if job.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=job.lr, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    return torch.optim.SGD(params, lr=job.lr, momentum=0.9, foreach=False)


def train(job: LayoutJob) -> LayoutRun:
    """job.steps optimizer steps of the lab's GPT under the job's layout on this launch's ranks; rank 0 then trains
    the same model in one process on the same batches and compares the losses and every parameter."""
    return _train(job, {})


def train_each(job: Layouts) -> LayoutRuns:
    """Several layouts of the same number of ranks, one after another in one launch (each on its own mesh): the
    processes start once. One process's run is made once per distinct model, batch and optimizer."""
    references: dict = {}
    return LayoutRuns([_train(j, references) for j in job.jobs])


def _train(job: LayoutJob, references: dict) -> LayoutRun:
    from labtools.parallel.comm import WireBytes
    dims = job.dims
    dims.check(n_layer=job.n_layer, n_head=job.n_head, n_embd=job.n_embd, block_size=job.block_size,
               batch_size=job.batch_size, micro_batches=job.micro_batches, world=dist.get_world_size(),
               n_experts=job.n_experts)
    mesh = _mesh(dims)
    stage = build_stage(job, mesh)
    opt = _optimizer(stage.parameters(), job)
    schedule = None
    if dims.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        pipe = PipelineStage(stage, mesh["pp"].get_local_rank(), dims.pp, device(), group=mesh["pp"].get_group())
        schedule = Schedule1F1B(pipe, n_microbatches=job.micro_batches, loss_fn=_loss)
    counted = stage.is_last and mesh["tp"].get_local_rank() == 0  # one loss per data and context shard
    g = torch.Generator().manual_seed(job.seed + 1)
    losses, wire = [], 0
    for step in range(job.steps):
        X, Y = global_batch(job, g, job.batch_size)
        Xr, Yr = _rows_and_positions(job, mesh, X, Y, stage.pos)
        with WireBytes() as sent:
            if schedule is None:
                loss = _loss(stage(Xr), Yr)
                loss.backward()
                local = loss.item()
            else:
                parts: list[torch.Tensor] = []
                schedule.step(*((Xr,) if stage.is_first else ()),
                              **(dict(target=Yr, losses=parts) if stage.is_last else {}))
                local = torch.stack(parts).mean().item() if stage.is_last else 0.0
            _average_gradients(stage, job, mesh)
            opt.step()
            if step == job.steps - 1:
                held = _state_bytes(stage, opt)
            opt.zero_grad(set_to_none=True)
        wire = None if sent.bytes is None or wire is None else wire + sent.bytes
        total = torch.tensor([local if counted else 0.0, float(counted)], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append((total[0] / total[1]).item())
        report_progress(step + 1, job.steps, str(dims))
    whole = _gather_parameters(stage)
    per_rank = None if wire is None else wire / job.steps / dist.get_world_size()
    fullest = torch.tensor([held], dtype=torch.float64)
    dist.all_reduce(fullest, op=dist.ReduceOp.MAX)
    if dist.get_rank() != 0:
        return LayoutRun(layout=str(dims), losses=losses, wire_bytes=per_rank, state_bytes=fullest.item())
    key = replace(job, **{n: 1 for n in DIMS}, plant="", micro_batches=1)
    if key not in references:
        references[key] = single_process(job)
    return replace(_compare(job, losses, whole, references[key], per_rank), state_bytes=fullest.item())


def _state_bytes(stage: nn.Module, opt: torch.optim.Optimizer) -> float:
    """Bytes of this rank's own pieces of the weights, their gradients and the optimizer's state (counted)."""
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    total = 0
    for p in stage.parameters():
        total += local(p) + (local(p.grad) if p.grad is not None else 0)
        total += sum(local(v) for v in opt.state.get(p, {}).values() if torch.is_tensor(v) and v.dim() > 0)
    return float(total)


def _gather_parameters(stage: nn.Module) -> dict[str, torch.Tensor] | None:
    """Every parameter of the model, whole, on rank 0 (None elsewhere): each stage's gathered over its shards, then
    sent to rank 0 by the ranks at the origin of the other dimensions."""
    mine = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu() for n, p in
            stage.named_parameters()}
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, parts, dst=0)
    if parts is None:
        return None
    whole = {}
    for part in parts:
        whole.update(part)
    return whole


def single_process(job: LayoutJob) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same GPT and batches in one process: job.steps optimizer steps on the whole batch."""
    gpt = build_gpt_for(job)
    opt = _optimizer(gpt.parameters(), job)
    g = torch.Generator().manual_seed(job.seed + 1)
    losses = []
    for _ in range(job.steps):
        X, Y = global_batch(job, g, job.batch_size)
        _, loss = gpt(X, Y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {n: p.detach().cpu() for n, p in gpt.named_parameters()}


def _compare(job: LayoutJob, losses: list[float], whole: dict[str, torch.Tensor], reference,
             wire_bytes: float | None) -> LayoutRun:
    ref_losses, ref = reference
    if set(whole) != set(ref):
        raise RuntimeError(f"the layout's parameters differ from the model's: {sorted(set(whole) ^ set(ref))}")
    rel = {n: ((whole[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12)).item() for n in ref}
    worst = max(rel, key=rel.get)
    return LayoutRun(layout=str(job.dims), losses=losses, reference=ref_losses,
                     loss_rel=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                     param_rel=rel[worst], worst_param=worst, params=sum(p.numel() for p in ref.values()),
                     wire_bytes=wire_bytes)


# --- what the planner's arithmetic says each rank sends ------------------------------------------------------------

SPLIT_BY_TP = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def predicted_bytes(job: LayoutJob) -> dict[str, float]:
    """Bytes each rank sends per step, on average over the ranks, by what sends them, from ring collectives'
    arithmetic (labtools.layout.collective_bytes): the gradients averaged over dp × ep × cp (an expert's over
    dp × cp), FSDP's all-gathers
    (forward, and again in backward for the blocks it reshards) and its reduce-scatter of the gradients (on gloo
    as many bytes as an all-reduce, as lesson 08 measured), tensor parallelism's four all-reduces per block and
    micro-batch, the pipeline's activations and their gradients, the ring's key/value blocks forward and back, and
    the experts' all-to-alls under an even router. Headers and the few bytes of barriers, positions and the loss
    are left out."""
    from labtools.layout import collective_bytes
    d, e = job.dims, 4  # fp32
    gpt = build_gpt_for(job, on="meta")
    L, h = job.n_layer, job.n_embd
    rows = job.batch_size // d.data                       # rows each data-parallel rank trains per step
    s = job.block_size // d.cp                            # positions each context-parallel rank holds
    m = job.micro_batches if d.pp > 1 else 1

    def local(name: str, p) -> float:                     # this rank's bytes of a parameter (fp32)
        split = d.ep if ".experts." in name else d.tp if name.endswith(SPLIT_BY_TP) else 1
        return p.numel() * e / split / d.fsdp

    def stage_of(name: str) -> int:
        if name.startswith("transformer.h."):
            return int(name.split(".")[2]) // (L // d.pp)
        return 0 if name.startswith(("transformer.wte", "transformer.wpe")) else d.pp - 1

    params = list(gpt.named_parameters())
    per_stage = [sum(local(n, p) for n, p in params if stage_of(n) == k) for k in range(d.pp)]
    blocks = [sum(local(n, p) for n, p in params if stage_of(n) == k and n.startswith("transformer.h."))
              for k in range(d.pp)]
    out = {"gradients": 0.0, "fsdp": 0.0, "tp": 0.0, "pp": 0.0, "cp": 0.0, "ep": 0.0}
    for names, R in ((lambda n: ".experts." not in n, d.dp * d.ep * d.cp), (lambda n: ".experts." in n, d.dp * d.cp)):
        if R > 1:  # the dense parameters are alike on dp · ep · cp ranks, an expert on dp · cp
            out["gradients"] += sum(collective_bytes("all_reduce", sum(local(n, p) for n, p in params
                                                                        if stage_of(n) == k and names(n)), R)
                                    for k in range(d.pp)) / d.pp
    if d.fsdp > 1:  # the root's parameters gathered once (FSDP2 keeps them to backward), each block's before its
        f = d.fsdp     # forward and again before its backward, per micro-batch; gradients reduced once, gloo's
        #                reduce-scatter sending as much as an all-reduce (lesson 08)
        gathers = [(st - bl + 2 * m * bl) * f for st, bl in zip(per_stage, blocks)]
        out["fsdp"] = sum(collective_bytes("all_gather", g, f) + collective_bytes("all_reduce", st * f, f)
                          for g, st in zip(gathers, per_stage)) / d.pp
    if d.tp > 1:
        out["tp"] = 4 * (L // d.pp) * collective_bytes("all_reduce", rows * s * h * e, d.tp)
    if d.pp > 1:  # each boundary: activations forward, their gradients back; a stage sends one way each
        out["pp"] = 2 * (d.pp - 1) * rows * s * h * e / d.pp
    if d.cp > 1:  # per block: c − 1 key/value blocks of this rank's heads forward, their gradients back
        out["cp"] = (L // d.pp) * 2 * (d.cp - 1) * 2 * rows * s * (h // d.tp) * e
    if d.ep > 1:  # per block: each token's k assignments, (ep − 1)/ep of them to another rank under an even router,
        #           there and back, forward and again backward
        out["ep"] = L * 2 * 2 * rows * s * job.top_k * (d.ep - 1) / d.ep * h * e
    return out


def predicted_state_bytes(job: LayoutJob) -> float:
    """Model states per rank as the planner counts them (labtools.budget.estimate: fp32 weights and gradients, one
    momentum number per weight for SGD, two for AdamW; tp, pp and ep divide them evenly, FSDP shards them all over
    fsdp, lesson 06's ZeRO-3), with the experts split over ep and the rest not."""
    from labtools.budget import estimate
    d = job.dims
    gpt = build_gpt_for(job, on="meta")
    experts = sum(p.numel() for n, p in gpt.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for p in gpt.parameters()) - experts
    kw = dict(precision="fp32", optimizer="momentum" if job.optimizer == "sgd" else "adamw",
              zero_stage=3 if d.fsdp > 1 else 0, dp=d.fsdp, tp=d.tp, pp=d.pp)
    return estimate(dense, **kw).model_states + (estimate(experts, **kw).model_states / d.ep if experts else 0.0)
