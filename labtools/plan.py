"""Planning arithmetic for parallel training: pipeline bubbles, collective bytes and α-β time, layouts.

Pure functions of numbers — no torch.distributed, nothing measured here. Every value they return is
*predicted*; the lessons put them beside what real ranks measure.

    bubble_fraction(p, m, v=1)          idle share of a synchronous pipeline: (p−1)/(v·m + p−1)
    collective_bytes(kind, M, N)        bytes each rank sends in a ring collective over M bytes
    collective_time(kind, M, N, β, α)   α-β model: α per ring step + bytes / β
    MODELS, memory_per_gpu(...)         published model shapes and their memory per GPU (labtools.budget)
    layouts(world, model), check_layout every dp × tp × pp × cp that fits the model's shape, with reasons
    step_time, rank_layouts, CLUSTERS   the planner: memory and time per step of a layout, ranked
    run_plan(...)                       a whole run: days, GPU-hours, cost and the time failures take
    tensor_parallel_bytes(...)          bytes a rank sends per forward + backward under tensor parallelism

The FLOPs of a run and its days at a given MFU are in labtools.compute.

Used by notebooks/06_memory_budget.ipynb; the pipeline, tensor-parallel and compute lessons build on it, and lesson 16
(notebooks/16_plan_a_run.ipynb) plans whole runs with it.
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
    n_kv_head: int | None = None  # grouped-query attention: heads of keys and values (None: n_head)

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values) of one token: n_embd · n_kv_head / n_head."""
        return self.n_embd * (self.n_kv_head or self.n_head) // self.n_head


# Published sizes with depth, width, heads, vocabulary and training context. Activations are computed for a
# GPT-2-style block of the same depth and width (labtools.budget.architecture).
MODELS = {
    "GPT-2 124M": ModelShape(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=1024),
    "7B": ModelShape(n_layer=32, n_embd=4096, n_head=32, vocab=32000, seq=4096, n_params=7_000_000_000),
    "13B": ModelShape(n_layer=40, n_embd=5120, n_head=40, vocab=32000, seq=4096, n_params=13_000_000_000),
    "70B": ModelShape(n_layer=80, n_embd=8192, n_head=64, vocab=32000, seq=4096, n_params=70_000_000_000),
    "GPT-3 175B": ModelShape(n_layer=96, n_embd=12288, n_head=96, vocab=50257, seq=2048, n_params=175_000_000_000),
    # Llama 3 405B (Dubey et al. 2024, table 3): 126 layers, width 16384, 128 heads of which 8 for keys and values
    "405B": ModelShape(n_layer=126, n_embd=16384, n_head=128, vocab=128256, seq=8192, n_params=405_000_000_000,
                       n_kv_head=8),
}


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    cp: int = 1  # context parallelism (lesson 14): each of cp ranks holds 1/cp of every sequence

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def __str__(self) -> str:
        return f"dp {self.dp} × tp {self.tp} × pp {self.pp}" + (f" × cp {self.cp}" if self.cp > 1 else "")


def check_layout(model: ModelShape, layout: Layout, world: int | None = None, gpus_per_node: int | None = None) -> None:
    """Raise ValueError naming the constraint a layout breaks: positive degrees, dp·tp·pp·cp = world, tp divides
    the heads (each rank keeps whole heads), pp at most the layers (a stage needs a layer), 2·cp divides the
    sequence (each context-parallel rank holds a head and a tail piece, lesson 14), tp within a node."""
    for name in ("dp", "tp", "pp", "cp"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if world is not None and layout.world != world:
        degrees = " · ".join(str(getattr(layout, k)) for k in ("dp", "tp", "pp", "cp"))
        raise ValueError(f"dp · tp · pp · cp must equal the world size: {degrees} = {layout.world} != {world}")
    if layout.cp > 1 and model.seq % (2 * layout.cp):
        raise ValueError(f"2·cp must divide the sequence (a head and a tail piece per rank): seq {model.seq}, "
                         f"cp = {layout.cp}")
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
    them) and by cp (each context-parallel rank holds 1/cp of the tokens; the keys and values it borrows for
    attention are left out). A 1F1B pipeline's first stage holds pp micro-batches of its ⌈L/pp⌉ layers — about
    L layers' worth: pipelining does not shrink that stage's activations. Uneven stages are counted by their
    largest. The weights are replicated over dp and cp, so ZeRO shards over dp·cp ranks.
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
    acts = int((blocks + arch.activations["outside"]) / (layout.tp * layout.cp))
    return estimate(n, precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=layout.dp * layout.cp,
                    tp=layout.tp,
                    pp=layout.pp, offload=offload, activations=acts, grads=grads, param_shapes=shapes)


def layouts(world: int, model: ModelShape, gpus_per_node: int | None = None, cp: tuple[int, ...] = (1,)
            ) -> list[Layout]:
    """Every dp × tp × pp × cp = world that check_layout accepts, with cp from `cp`, smallest model-parallel
    degree first."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world must be an int >= 1, got {world!r}")
    out = []
    for c in cp:
        if world % c:
            continue
        for tp in _divisors(world // c):
            for pp in _divisors(world // (c * tp)):
                layout = Layout(world // (c * tp * pp), tp, pp, c)
                try:
                    check_layout(model, layout, world, gpus_per_node)
                except ValueError:
                    continue
                out.append(layout)
    return sorted(out, key=lambda lay: (lay.tp * lay.pp * lay.cp, lay.tp, lay.cp))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- the planner: memory and step time of a layout on a cluster ---------------------------------------------


@dataclass(frozen=True)
class LinkCost:
    """One collective's α-β model: seconds = steps · latency + bytes each rank sends / bandwidth."""
    latency: float     # α, seconds per ring step
    bandwidth: float   # β, bytes/s

    def seconds(self, kind: str, n_bytes: float, world: int) -> float:
        return collective_time(kind, n_bytes, world, self.bandwidth, self.latency)


@dataclass(frozen=True)
class CollectiveCosts:
    """α and β of each collective the data-parallel traffic uses, where they were measured apart (a machine whose
    reduce-scatter is not the ring's half of an all-reduce: gloo's sends as much as its all-reduce, lesson 08)."""
    all_reduce: LinkCost
    all_gather: LinkCost
    reduce_scatter: LinkCost


@dataclass(frozen=True)
class Cluster:
    """GPUs and links, per GPU. Bandwidths are one direction's bytes/s (a 100 Gb/s link is 12.5e9)."""
    gpus_per_node: int
    gpu_memory: float      # bytes
    peak_flops: float      # dense bf16 FLOP/s
    intra_bw: float        # within a node (NVLink)
    inter_bw: float        # between nodes (InfiniBand, one NIC per GPU)
    latency: float = 5e-6  # α per ring step, seconds
    collectives: CollectiveCosts | None = None  # measured per collective: used for the data-parallel traffic

    def dp_seconds(self, kind: str, n_bytes: float, world: int) -> float:
        """A data-parallel collective between nodes: its measured α-β where given, else the ring's over inter_bw."""
        if self.collectives is not None:
            return getattr(self.collectives, kind).seconds(kind, n_bytes, world)
        return collective_time(kind, n_bytes, world, self.inter_bw, self.latency)


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
    compute_s: float       # the hardware's FLOPs (recomputation included) at the assumed efficiency
    bubble: float          # pipeline idle fraction
    bubble_s: float
    tp_comm_s: float       # tensor-parallel all-reduces, on the critical path
    dp_comm_s: float       # gradient all-reduce; hidden behind backward as far as dp_overlap says
    pp_comm_s: float       # activations between stages
    step_s: float
    cp_comm_s: float = 0.0     # context parallelism: gathering the other ranks' keys and values, exposed
    dp_exposed_s: float = 0.0  # the part of dp_comm_s that backward does not hide
    model_flops: float = 0.0   # the model's FLOPs per step, 6N + 12·L·s·h per token, recomputation not counted
    peak_flops: float = 0.0    # per GPU
    v: int = 1                 # virtual pipeline stages per rank the step ran with
    hardware_flops: float = 0.0  # FLOPs the GPUs run per step: model_flops plus any recomputed forward

    @property
    def breakdown(self) -> dict[str, float]:
        """The step's seconds by part; they add up to step_s."""
        return {"compute": self.compute_s, "bubble": self.bubble_s, "TP comm": self.tp_comm_s,
                "CP comm": self.cp_comm_s, "DP comm (exposed)": self.dp_exposed_s, "PP comm": self.pp_comm_s}

    @property
    def flops_per_gpu(self) -> float:
        """Model FLOP/s each GPU achieves over the whole step (the 'TFLOPs/GPU' papers report)."""
        return self.model_flops / (self.step_s * self.layout.world)

    @property
    def hardware_flops_per_gpu(self) -> float:
        """Hardware FLOP/s each GPU achieves over the whole step, recomputation counted (Megatron-LM's figure)."""
        return self.hardware_flops / (self.step_s * self.layout.world)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: flops_per_gpu ÷ the GPU's peak (lesson 12)."""
        return self.flops_per_gpu / self.peak_flops


def _positive_int(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def step_time(model: ModelShape, cluster: Cluster, layout: Layout, global_batch: int, *, micro_batch: int = 1,
              v: int = 1, efficiency: float = 0.5, zero_stage: int = 1, checkpoint: str = "block",
              dp_overlap: float = 1.0, precision: str = "bf16-mixed", require_fit: bool = False) -> StepEstimate:
    """Predicted memory per GPU and time per step (seconds) of training `model` with `layout` on `cluster`.

    Assumptions, stated:
    - AdamW in `precision` (bf16-mixed: activations and gradients travel as bf16, 2 bytes; fp32: 4);
    - the hardware's FLOPs run at `efficiency` of peak while a GPU computes (a hardware FLOPs utilisation: with
      checkpoint="block" every layer's forward runs twice, 8N instead of 6N);
    - a pipeline of pp stages with v virtual stages per rank idles bubble_fraction(pp, m, v);
    - tensor parallelism's 4 (6 with recomputation) all-reduces of b·s·h/cp values per layer and micro-batch are
      exposed, over NVLink when tp fits a node, else over the network;
    - context parallelism all-gathers each layer's keys and values (b·s·2·kv_width values, of the kv heads the
      tensor-parallel rank holds) in forward and reduce-scatters their gradients in backward (and gathers again
      when recomputing), exposed, over NVLink when tp·cp fits a node, else over the network (Llama 3's
      all-gather context parallelism, Dubey et al. 2024, section 3.3.2);
    - the gradient all-reduce (over the dp·cp ranks that replicate the weights) runs over the network and
      `dp_overlap` of it hides behind backward; with zero_stage 1 or 2 it is a reduce-scatter of the gradients and
      an all-gather of the updated weights (on a ring, the all-reduce's bytes and steps); with zero_stage=3 the
      weights' all-gather in forward,
      again in backward, and the gradients' reduce-scatter, one of each per unit (a layer; the embeddings and head
      one more), hidden as far; the cluster's measured per-collective costs replace the ring's where it has them; pipeline sends of b·s·h/(tp·cp) per boundary are exposed once.
    require_fit=True raises ValueError when the layout does not fit the GPU's memory.
    """
    check_layout(model, layout)
    _positive_int(global_batch=global_batch, micro_batch=micro_batch, v=v)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    if not 0 <= dp_overlap <= 1:
        raise ValueError(f"dp_overlap must be in [0, 1], got {dp_overlap!r}")
    if global_batch % (layout.dp * micro_batch):
        raise ValueError(f"the global batch ({global_batch}) must split into dp × micro_batch = "
                         f"{layout.dp} × {micro_batch} sequences")
    m = global_batch // (layout.dp * micro_batch)
    if v > 1 and m % layout.pp:
        raise ValueError(f"interleaving needs the micro-batches per pipeline ({m}) to be a multiple of "
                         f"pp = {layout.pp}")
    recompute = checkpoint == "block"
    mem = memory_per_gpu(model, layout, zero_stage=zero_stage, micro_batch=micro_batch, checkpoint=checkpoint,
                         precision=precision)
    world, tokens, bpe = layout.world, global_batch * model.seq, 4 if precision == "fp32" else 2
    compute = flops_per_token(model, recompute) * tokens / (world * cluster.peak_flops * efficiency)
    bubble = bubble_fraction(layout.pp, m, v) if layout.pp > 1 else 0.0
    bubble_s = compute * bubble / (1 - bubble)
    layers = math.ceil(model.n_layer / layout.pp)  # each rank runs its stage's layers, m micro-batches
    bsh = micro_batch * model.seq * model.n_embd * bpe / layout.cp
    link = lambda ranks: cluster.intra_bw if ranks <= cluster.gpus_per_node else cluster.inter_bw  # noqa: E731
    tp_s = 0.0
    if layout.tp > 1:
        per_layer = (6 if recompute else 4) * collective_time("all_reduce", bsh, layout.tp, link(layout.tp),
                                                              cluster.latency)
        tp_s = per_layer * layers * m
    cp_s = 0.0
    if layout.cp > 1:
        # the keys and values of a micro-batch's whole sequence, of the kv heads this tensor-parallel rank holds
        kv_heads = model.n_kv_head or model.n_head
        kv = micro_batch * model.seq * 2 * model.kv_width * max(1, kv_heads // layout.tp) / kv_heads * bpe
        per_layer = (3 if recompute else 2) * collective_time("all_gather", kv, layout.cp,
                                                              link(layout.tp * layout.cp), cluster.latency)
        cp_s = per_layer * layers * m
    n = model.n_params or architecture(model.n_layer, model.n_embd, model.n_head, model.vocab, model.seq, 1).n_params
    replicas, held = layout.dp * layout.cp, bpe * n / (layout.tp * layout.pp)
    dp_s = 0.0
    if replicas > 1 and zero_stage == 3:
        # the weights gathered in forward and again in backward, the gradients scattered: one collective per unit,
        # each layer a unit and the embeddings and head one more (as FSDP wraps them), so each pays its latency
        units = layers + 1
        dp_s = units * (2 * cluster.dp_seconds("all_gather", held / units, replicas)
                        + cluster.dp_seconds("reduce_scatter", held / units, replicas))
    elif replicas > 1 and zero_stage in (1, 2):  # the gradients reduce-scattered, the updated weights all-gathered
        dp_s = cluster.dp_seconds("reduce_scatter", held, replicas) + cluster.dp_seconds("all_gather", held, replicas)
    elif replicas > 1:  # the gradients all-reduced: on a ring the same bytes and steps as the two above
        dp_s = cluster.dp_seconds("all_reduce", held, replicas)
    pp_s = 2 * (layout.pp - 1) * bsh / layout.tp / cluster.inter_bw if layout.pp > 1 else 0.0
    step = compute + bubble_s + tp_s + cp_s + (1 - dp_overlap) * dp_s + pp_s
    if require_fit and mem.total > cluster.gpu_memory:
        raise ValueError(f"{layout} does not fit: {mem.total / 1e9:.1f} GB per GPU > the GPU's "
                         f"{cluster.gpu_memory / 1e9:.0f} GB ({mem.convention})")
    return StepEstimate(layout, mem, mem.total <= cluster.gpu_memory, m, compute, bubble, bubble_s, tp_s, dp_s, pp_s,
                        step, cp_s, (1 - dp_overlap) * dp_s, flops_per_token(model) * tokens, cluster.peak_flops, v,
                        flops_per_token(model, recompute) * tokens)


def rank_layouts(model: ModelShape, cluster: Cluster, world: int, global_batch: int, cp: tuple[int, ...] = (1,),
                 **kw) -> list[StepEstimate]:
    """Every dp × tp × pp × cp layout of `world` GPUs (tp within a node, cp from `cp`) that the batch allows,
    fastest fitting first, then those that do not fit. A layout whose micro-batches do not allow interleaving with
    kw's v runs plain 1F1B (v = 1; StepEstimate.v says which)."""
    out = []
    for layout in layouts(world, model, cluster.gpus_per_node, cp):
        for v in dict.fromkeys((kw.get("v", 1), 1)):
            try:
                out.append(step_time(model, cluster, layout, global_batch, **(kw | {"v": v})))
                break
            except ValueError:
                continue  # the batch does not split over this dp (any v), or interleaving over this pp (try v = 1)
    return sorted(out, key=lambda e: (not e.fits, e.step_s))


# --- a whole run: days, cost and failures -------------------------------------------------------------------

# Llama 3 405B: 419 unexpected interruptions in 54 days of pre-training on up to 16,384 GPUs (Dubey et al. 2024,
# section 3.3.4): a mean time between failures of about 51,000 hours per GPU, if failures scale with the GPU count.
LLAMA3_GPU_MTBF_H = 54 * 24 * 16384 / 419


@dataclass(frozen=True)
class RunPlan:
    step: StepEstimate
    steps: int
    days: float            # steps × step time, no failures
    gpu_hours: float
    cost: float            # dollars, failures included
    job_mtbf_h: float      # mean time between failures of the whole job
    interval_s: float      # checkpoint interval, Young's √(2·δ·MTBF) (lesson 11)
    waste: float           # fraction of the run lost to saving, recomputing lost work and restarting
    days_with_failures: float


def run_plan(model: ModelShape, cluster: Cluster, layout: Layout, global_batch: int, tokens: float, *,
             dollars_per_gpu_hour: float = 2.0, gpu_mtbf_h: float = LLAMA3_GPU_MTBF_H, save_s: float = 30.0,
             restart_s: float = 600.0, **step_kw) -> RunPlan:
    """A whole run of `tokens` tokens: step_time for the step, lesson 12's days and dollars, lesson 11's waste.

    Failures: the job fails gpu_mtbf_h / world hours apart on average; it saves every √(2·save_s·MTBF) seconds
    and a failure costs half an interval of lost work plus restart_s. Waste stretches the run by 1 / (1 − waste).
    """
    from labtools.checkpoint import waste, young_interval
    for name, value in (("tokens", tokens), ("dollars_per_gpu_hour", dollars_per_gpu_hour),
                        ("gpu_mtbf_h", gpu_mtbf_h), ("save_s", save_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not 0 <= restart_s < math.inf:
        raise ValueError(f"restart_s must be >= 0, got {restart_s!r}")
    est = step_time(model, cluster, layout, global_batch, **step_kw)
    steps = math.ceil(tokens / (global_batch * model.seq))
    seconds = steps * est.step_s
    mtbf_s = gpu_mtbf_h * 3600 / layout.world
    interval = young_interval(save_s, mtbf_s)
    lost = sum(waste(interval, save_s, mtbf_s, restart_s).values())
    if lost >= 1:
        raise ValueError(f"failures every {mtbf_s / 60:.1f} min on {layout.world:,} GPUs leave no time to train "
                         f"(saving {save_s:g} s, restarting {restart_s:g} s)")
    wall = seconds / (1 - lost)
    return RunPlan(est, steps, seconds / 86400, wall / 3600 * layout.world, wall / 3600 * layout.world *
                   dollars_per_gpu_hour, mtbf_s / 3600, interval, lost, wall / 86400)
