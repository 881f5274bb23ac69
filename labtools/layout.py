"""The arithmetic of a parallel layout: pipeline bubbles, the bytes and α-β time of ring collectives, tensor
parallelism's traffic, and the layouts dp × tp × pp × cp of a world with the memory each GPU holds.

Pure functions of numbers — no torch.distributed, nothing measured here. Every value they return is *predicted*;
the lessons put them beside what real ranks measure. The planner that adds them into a step (labtools.plan) and the
shapes it plans for (labtools.shapes) build on it.

    bubble_fraction(p, m, v=1)          idle share of a synchronous pipeline: (p−1)/(v·m + p−1)
    collective_bytes(kind, M, N)        bytes each rank sends in a ring collective over M bytes
    collective_time(kind, M, N, β, α)   α-β model: α per ring step + bytes / β
    tensor_parallel_bytes(...)          bytes a rank sends per forward + backward under tensor parallelism
    Layout, check_layout, layouts       a layout, the constraints it must meet, every one that fits a world
    memory_per_gpu(model, layout, ...)  model states (labtools.budget) and activations per GPU
    moe_model_states(shape, pp, ep, dp) a mixture of experts' model states per GPU, its experts split over ep
"""

import math
from dataclasses import dataclass

from labtools.budget import MemoryBudget, architecture, estimate
from labtools.shapes import ModelShape, MoEShape
from labtools.validate import check_range

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


# --- layouts --------------------------------------------------------------------------------------


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
    check_range("world", world, 1, None, int)
    for c in cp:
        check_range("cp", c, 1, None, int)
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


def moe_model_states(shape: MoEShape, pp: int, ep: int, dp: int, zero_stage: int = 1) -> float:
    """Bytes of model states per GPU (bf16 mixed-precision AdamW, 16 bytes per parameter, lesson 06): everything
    split over pp stages; the routed experts also over ep ranks; ZeRO-1 shards the 12 bytes of master weights and
    moments over the ranks holding the same weights (dp of them for the rest, dp / ep for an expert)."""
    if dp % ep:
        raise ValueError(f"the expert-parallel size ep ({ep}) must divide the data-parallel size dp ({dp})")
    p = shape.params()
    rest, routed = (p["total"] - p["routed"]) / pp, p["routed"] / (pp * ep)
    shard = (lambda n: 12 / n) if zero_stage >= 1 else (lambda n: 12)
    return rest * (4 + shard(dp)) + routed * (4 + shard(dp // ep))
