"""The planner: memory and time per step of a layout on a cluster, the layouts of a cluster ranked, and a whole run
(days, cost, the time failures take).

Pure functions of numbers; every value is *predicted*. It adds up what the course measured piece by piece
(labtools.layout: bubbles, collectives, memory per GPU; labtools.compute: FLOPs per token) for a model of
labtools.shapes on a Cluster. Lesson 16 (notebooks/16_plan_a_run.ipynb) checks it against published runs
(labtools.runs) and calibrates it on this machine.

    Cluster, CLUSTERS, GPU             GPUs and links (vendor figures), keyed by a GPU enum; labels for display
    step_time(model, cluster, layout, ...)   a step's parts: compute, bubble, TP/CP/DP/PP communication
    rank_layouts(model, cluster, world, batch)   every layout that the batch allows, fastest fitting first
    run_plan(...)                       a whole run: days, GPU-hours, cost and the time failures take
"""

import math
from dataclasses import dataclass

from labtools.budget import MemoryBudget
from labtools.keys import Key
from labtools.layout import (COLLECTIVES, Layout, bubble_fraction, check_layout, collective_bytes,  # noqa: F401
                             collective_steps, collective_time, layouts, memory_per_gpu, pipeline_efficiency,
                             tensor_parallel_bytes)
from labtools.runs import LLAMA3_GPU_MTBF_H
from labtools.shapes import MODELS, ModelShape  # noqa: F401 - the shapes it plans for
from labtools.validate import check_range

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

    def __post_init__(self):
        check_range("gpus_per_node", self.gpus_per_node, 1, None, int)
        for name in ("gpu_memory", "peak_flops", "intra_bw", "inter_bw"):
            check_range(name, getattr(self, name), 0, None, open_lo=True)
        check_range("latency", self.latency, 0, None)

    def dp_seconds(self, kind: str, n_bytes: float, world: int) -> float:
        """A data-parallel collective between nodes: its measured α-β where given, else the ring's over inter_bw."""
        if self.collectives is not None:
            return getattr(self.collectives, kind).seconds(kind, n_bytes, world)
        return collective_time(kind, n_bytes, world, self.inter_bw, self.latency)


# Vendor figures (dense bf16, NVLink per direction = half the quoted bidirectional, one HDR/NDR NIC per GPU).
class GPU(Key):
    """The clusters the lessons plan on, by their GPU."""
    A100 = "a100"
    H100 = "h100"


CLUSTERS = {
    GPU.A100: Cluster(8, 80e9, 312e12, 300e9, 25e9),
    GPU.H100: Cluster(8, 80e9, 989e12, 450e9, 50e9),
}
CLUSTER_LABELS = {GPU.A100: "A100 80GB, NVLink 3, HDR 200 Gb/s", GPU.H100: "H100 80GB, NVLink 4, NDR 400 Gb/s"}


class Part(Key):
    """The parts a step's time adds up from (StepEstimate.breakdown); PART_LABELS names them for a reader."""
    COMPUTE = "compute"
    BUBBLE = "bubble"
    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"


PART_LABELS = {Part.COMPUTE: "compute", Part.BUBBLE: "bubble", Part.TP: "TP comm", Part.CP: "CP comm",
               Part.DP: "DP comm (exposed)", Part.PP: "PP comm"}


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
    def breakdown(self) -> dict["Part", float]:
        """The step's seconds by part; they add up to step_s."""
        return {Part.COMPUTE: self.compute_s, Part.BUBBLE: self.bubble_s, Part.TP: self.tp_comm_s,
                Part.CP: self.cp_comm_s, Part.DP: self.dp_exposed_s, Part.PP: self.pp_comm_s}

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
    compute = model.flops_per_token(recompute) * tokens / (world * cluster.peak_flops * efficiency)
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
    n = model.params()
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
                        step, cp_s, (1 - dp_overlap) * dp_s, model.flops_per_token() * tokens, cluster.peak_flops, v,
                        model.flops_per_token(recompute) * tokens)


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
    save_s: float = 30.0   # δ: the seconds a save stalls training


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
                   dollars_per_gpu_hour, mtbf_s / 3600, interval, lost, wall / 86400, save_s)
