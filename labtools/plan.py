"""Planning arithmetic for parallel training: pipeline bubbles, collective bytes and α-β time, layouts.

Pure functions of numbers — no torch.distributed, nothing measured here. Every value they return is
*predicted*; the lessons put them beside what real ranks measure.

    bubble_fraction(p, m, v=1)          idle share of a synchronous pipeline: (p−1)/(v·m + p−1)
    collective_bytes(kind, M, N)        bytes each rank sends in a ring collective over M bytes
    collective_time(kind, M, N, β, α)   α-β model: α per ring step + bytes / β
    MODELS, memory_per_gpu(...)         published model shapes and their memory per GPU (labtools.budget)
    layouts(world, model), check_layout  every dp × tp × pp that fits the model's shape, with reasons
    step_time, rank_layouts, CLUSTERS      the 3-D planner: memory and time per step of a layout, ranked
    tensor_parallel_bytes(...)          bytes a rank sends per forward + backward under tensor parallelism

The FLOPs, days and cost of a whole run are in labtools.compute.

Used by notebooks/06_memory_budget.ipynb; the pipeline, tensor-parallel and compute lessons build on it.
"""

import math
from dataclasses import dataclass

from labtools.budget import MemoryBudget, architecture, estimate
from labtools.compute import flops_per_token

# --- pipelines -------------------------------------------------------------------------------------------------


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle fraction of a synchronous pipeline (GPipe, 1F1B): (p−1)/(v·m + p−1).

    p stages, m micro-batches per step, v virtual stages per rank (interleaved 1F1B; v = 1 otherwise).
    Each rank works v·m slots of one chunk's forward+backward and waits p − 1 slots while the pipeline
    fills and drains (Narayanan et al. 2021, §2.2).
    """
    for name, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return (p - 1) / (v * m + p - 1)


def pipeline_efficiency(p: int, m: int, v: int = 1) -> float:
    """Useful fraction of a pipeline step: 1 − bubble = v·m / (v·m + p − 1)."""
    return 1.0 - bubble_fraction(p, m, v)


# --- collectives ---------------------------------------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def _check_collective(kind: str, n_bytes: float, world: int) -> None:
    if kind not in COLLECTIVES:
        raise ValueError(f"kind must be one of {COLLECTIVES}, got {kind!r}")
    if not n_bytes >= 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world must be an int >= 1, got {world!r}")


def collective_steps(kind: str, world: int) -> int:
    """Ring steps: N − 1 for an all-gather or a reduce-scatter, 2(N − 1) for an all-reduce (one of each)."""
    _check_collective(kind, 0, world)
    return (2 if kind == "all_reduce" else 1) * (world - 1)


def collective_bytes(kind: str, n_bytes: float, world: int) -> float:
    """Bytes each rank sends (and receives) with the ring algorithm.

    n_bytes is the full, unsharded tensor: the all-reduced tensor, the all-gather's output, the
    reduce-scatter's input. All-reduce 2(N−1)/N·M; all-gather and reduce-scatter (N−1)/N·M each.
    """
    _check_collective(kind, n_bytes, world)
    return collective_steps(kind, world) / world * n_bytes


def collective_time(kind: str, n_bytes: float, world: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds for a ring collective under the α-β model: steps · α + bytes sent / β.

    bandwidth β in bytes/s per rank (a 100 Gb/s link is 12.5e9), latency α in seconds per step.
    """
    _check_collective(kind, n_bytes, world)
    if not bandwidth > 0 or not latency >= 0:
        raise ValueError(f"bandwidth must be > 0 and latency >= 0, got {bandwidth!r}, {latency!r}")
    return collective_steps(kind, world) * latency + collective_bytes(kind, n_bytes, world) / bandwidth


def tensor_parallel_bytes(n_layer: int, batch: int, seq: int, n_embd: int, t: int, sequence_parallel: bool,
                          bytes_per_element: int = 4) -> float:
    """Bytes each rank sends for one forward + backward, ring algorithms: per layer 4 all-reduces of b·s·h
    (2(t−1)/t each), or with sequence parallelism 4 all-gathers and 4 reduce-scatters ((t−1)/t each), the same
    8(t−1)/t·b·s·h per layer; sequence parallelism adds the gather before the final LayerNorm and its backward."""
    bsh = batch * seq * n_embd * bytes_per_element
    return n_layer * 8 * (t - 1) / t * bsh + (2 * (t - 1) / t * bsh if sequence_parallel else 0)


# --- models and layouts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A transformer by its dimensions; n_params None means "count it as labtools.model.GPT would"."""
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int
    seq: int                   # training context length
    n_params: int | None = None


# Published sizes with depth, width, heads, vocabulary and training context. Activations are computed for a
# GPT-2-style block of the same depth and width (labtools.budget.architecture).
MODELS = {
    "GPT-2 124M": ModelShape(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=1024),
    "7B": ModelShape(n_layer=32, n_embd=4096, n_head=32, vocab=32000, seq=4096, n_params=7_000_000_000),
    "13B": ModelShape(n_layer=40, n_embd=5120, n_head=40, vocab=32000, seq=4096, n_params=13_000_000_000),
    "70B": ModelShape(n_layer=80, n_embd=8192, n_head=64, vocab=32000, seq=4096, n_params=70_000_000_000),
    "GPT-3 175B": ModelShape(n_layer=96, n_embd=12288, n_head=96, vocab=50257, seq=2048, n_params=175_000_000_000),
    "405B": ModelShape(n_layer=126, n_embd=16384, n_head=128, vocab=128256, seq=8192, n_params=405_000_000_000),
}


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp {self.dp} × tp {self.tp} × pp {self.pp}"


def check_layout(model: ModelShape, layout: Layout, world: int | None = None, gpus_per_node: int | None = None) -> None:
    """Raise ValueError naming the constraint a layout breaks: positive degrees, dp·tp·pp = world, tp divides
    the heads (each rank keeps whole heads), pp at most the layers (a stage needs a layer), tp within a node."""
    for name in ("dp", "tp", "pp"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if world is not None and layout.world != world:
        raise ValueError(f"dp · tp · pp must equal the world size: {layout.dp} · {layout.tp} · {layout.pp} = "
                         f"{layout.world} != {world}")
    if model.n_head % layout.tp:
        raise ValueError(f"tp must divide the number of heads: {model.n_head} heads, tp = {layout.tp}")
    if layout.pp > model.n_layer:
        raise ValueError(f"pp must be at most the number of layers: {model.n_layer} layers, pp = {layout.pp}")
    if gpus_per_node is not None and layout.tp > gpus_per_node:
        raise ValueError(f"tp must stay within a node (its all-reduces need the node's fast links): "
                         f"tp = {layout.tp} > {gpus_per_node} GPUs per node")


def memory_per_gpu(model: ModelShape, layout: Layout = Layout(1, 1, 1), *, precision: str = "bf16-mixed",
                   optimizer: str = "adamw", zero_stage: int | str = 0, offload: str | None = None,
                   micro_batch: int = 1, seq: int | None = None, checkpoint: str = "none",
                   grads: str = "param") -> MemoryBudget:
    """Model states from labtools.budget.estimate, activations from the architecture, per GPU.

    Activations: one micro-batch through the stage's layers, divided by tp (tensor + sequence parallel split
    them). A 1F1B pipeline's first stage holds pp micro-batches of its ⌈L/pp⌉ layers — about L layers' worth:
    pipelining does not shrink that stage's activations. Uneven stages are counted by their largest.
    """
    check_layout(model, layout)
    bpe = 4 if precision == "fp32" else 2
    arch = architecture(model.n_layer, model.n_embd, model.n_head, model.vocab, seq or model.seq, micro_batch,
                        checkpoint=checkpoint, bytes_per_element=bpe)
    n = model.n_params or arch.n_params
    shapes = None
    if optimizer == "adafactor":  # its state depends on the matrices' shapes: count the GPT-style block's own
        n, shapes = arch.n_params, arch.param_shapes
    per_layer = arch.activations["blocks"] / model.n_layer
    stage_layers = math.ceil(model.n_layer / layout.pp)
    in_flight = layout.pp if layout.pp > 1 else 1
    blocks = per_layer * stage_layers * in_flight
    acts = int((blocks + arch.activations["outside"]) / layout.tp)
    return estimate(n, precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=layout.dp, tp=layout.tp,
                    pp=layout.pp, offload=offload, activations=acts, grads=grads, param_shapes=shapes)


def layouts(world: int, model: ModelShape, gpus_per_node: int | None = None) -> list[Layout]:
    """Every dp × tp × pp = world that check_layout accepts, smallest model-parallel degree first."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world must be an int >= 1, got {world!r}")
    out = []
    for tp in _divisors(world):
        for pp in _divisors(world // tp):
            layout = Layout(world // (tp * pp), tp, pp)
            try:
                check_layout(model, layout, world, gpus_per_node)
            except ValueError:
                continue
            out.append(layout)
    return sorted(out, key=lambda lay: (lay.tp * lay.pp, lay.tp))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- the 3-D planner: memory and step time of a layout on a cluster ----------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """GPUs and links, per GPU. Bandwidths are one direction's bytes/s (a 100 Gb/s link is 12.5e9)."""
    gpus_per_node: int
    gpu_memory: float      # bytes
    peak_flops: float      # dense bf16 FLOP/s
    intra_bw: float        # within a node (NVLink)
    inter_bw: float        # between nodes (InfiniBand, one NIC per GPU)
    latency: float = 5e-6  # α per ring step, seconds


# Vendor figures (dense bf16, NVLink per direction = half the quoted bidirectional, one HDR/NDR NIC per GPU).
CLUSTERS = {
    "A100 80GB, NVLink 3, HDR 200 Gb/s": Cluster(8, 80e9, 312e12, 300e9, 25e9),
    "H100 80GB, NVLink 4, NDR 400 Gb/s": Cluster(8, 80e9, 989e12, 450e9, 50e9),
}


@dataclass(frozen=True)
class StepEstimate:
    layout: Layout
    memory: MemoryBudget
    fits: bool
    micro_batches: int     # per pipeline per step
    compute_s: float       # the model's FLOPs at the assumed kernel efficiency
    bubble: float          # pipeline idle fraction
    bubble_s: float
    tp_comm_s: float       # tensor-parallel all-reduces, on the critical path
    dp_comm_s: float       # gradient all-reduce; hidden behind backward as far as dp_overlap says
    pp_comm_s: float       # activations between stages
    step_s: float

    @property
    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute_s, "bubble": self.bubble_s, "TP comm": self.tp_comm_s,
                "DP comm (exposed)": self.step_s - self.compute_s - self.bubble_s - self.tp_comm_s - self.pp_comm_s,
                "PP comm": self.pp_comm_s}


def step_time(model: ModelShape, cluster: Cluster, layout: Layout, global_batch: int, *, micro_batch: int = 1,
              v: int = 1, mfu: float = 0.5, zero_stage: int = 1, checkpoint: str = "block",
              dp_overlap: float = 1.0, require_fit: bool = False) -> StepEstimate:
    """Predicted memory per GPU and time per step (seconds) of training `model` with `layout` on `cluster`.

    Assumptions, stated: bf16 mixed-precision AdamW; compute runs at `mfu` of peak; with checkpoint="block" every
    layer is recomputed (one more forward, and its TP all-reduces again); tensor parallelism's 4 (6 with
    recomputation) all-reduces of b·s·h bf16 values per layer and micro-batch are exposed, over NVLink when tp
    fits a node, else over the network; the gradient all-reduce (bf16) runs over the network and `dp_overlap` of
    it hides behind backward; pipeline sends of b·s·h per micro-batch and boundary are exposed once per stage.
    require_fit=True raises ValueError when the layout does not fit the GPU's memory.
    """
    check_layout(model, layout)
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    if global_batch % (layout.dp * micro_batch):
        raise ValueError(f"the global batch ({global_batch}) must split into dp × micro_batch = "
                         f"{layout.dp} × {micro_batch} sequences")
    m = global_batch // (layout.dp * micro_batch)
    if v > 1 and m % layout.pp:
        raise ValueError(f"interleaving needs the micro-batches per pipeline ({m}) to be a multiple of "
                         f"pp = {layout.pp}")
    recompute = checkpoint == "block"
    mem = memory_per_gpu(model, layout, zero_stage=zero_stage, micro_batch=micro_batch, checkpoint=checkpoint)
    world = layout.world
    compute = flops_per_token(model, recompute) * global_batch * model.seq / (world * cluster.peak_flops * mfu)
    bubble = bubble_fraction(layout.pp, m, v) if layout.pp > 1 else 0.0
    bubble_s = compute * bubble / (1 - bubble)
    bsh = micro_batch * model.seq * model.n_embd * 2
    tp_bw = cluster.intra_bw if layout.tp <= cluster.gpus_per_node else cluster.inter_bw
    per_layer = (6 if recompute else 4) * collective_time("all_reduce", bsh, layout.tp, tp_bw, cluster.latency)
    tp_s = per_layer * math.ceil(model.n_layer / layout.pp) * m if layout.tp > 1 else 0.0  # each rank: L/pp layers
    n = model.n_params or architecture(model.n_layer, model.n_embd, model.n_head, model.vocab, model.seq, 1).n_params
    dp_s = collective_time("all_reduce", 2 * n / (layout.tp * layout.pp), layout.dp, cluster.inter_bw,
                           cluster.latency) if layout.dp > 1 else 0.0
    pp_s = 2 * (layout.pp - 1) * bsh / cluster.inter_bw if layout.pp > 1 else 0.0
    step = compute + bubble_s + tp_s + (1 - dp_overlap) * dp_s + pp_s
    if require_fit and mem.total > cluster.gpu_memory:
        raise ValueError(f"{layout} does not fit: {mem.total / 1e9:.1f} GB per GPU > the GPU's "
                         f"{cluster.gpu_memory / 1e9:.0f} GB ({mem.convention})")
    return StepEstimate(layout, mem, mem.total <= cluster.gpu_memory, m, compute, bubble, bubble_s, tp_s, dp_s, pp_s,
                        step)


def rank_layouts(model: ModelShape, cluster: Cluster, world: int, global_batch: int, **kw) -> list[StepEstimate]:
    """Every dp × tp × pp layout of `world` GPUs (tp within a node) that the batch allows, fastest fitting first,
    then those that do not fit."""
    out = []
    for layout in layouts(world, model, cluster.gpus_per_node):
        try:
            out.append(step_time(model, cluster, layout, global_batch, **kw))
        except ValueError:
            continue  # the batch does not split over this dp (or interleaving over this pp)
    return sorted(out, key=lambda e: (not e.fits, e.step_s))
