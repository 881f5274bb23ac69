"""Memory, predicted: what training holds, from the architecture and the layout (labtools.memory measures it).

    activation_bytes         saved activations of labtools.model.GPT from its shape and checkpoint policy,
                             derived by listing what each op of our block saves (notebook 05)
    estimate                 the whole budget per GPU: weights, gradients, fp32 master weights, optimizer
                             state, activations — under mixed precision, ZeRO/FSDP sharding, tensor and
                             pipeline parallelism and CPU offload, with its convention stated (notebook 06)
    architecture             n_params, parameter shapes and activation bytes from a GPT's dimensions

Introduced in notebooks/05_activation_checkpointing.ipynb and notebooks/06_memory_budget.ipynb.
"""

import math
from dataclasses import dataclass

from labtools.validate import check_range

# --- prediction: activations ------------------------------------------------------------------------------

# What each op of labtools.model.Block saves for backward, in elements of a (B, T, C) tensor, for
# fused attention (flash / memory-efficient SDPA, which does not keep the T×T matrix) and no dropout:
#   ln_1 input 1 · c_attn input 1 · q, k, v 3 (one storage) · attention output 1 (it is also c_proj's
#   input: the transpose back is free) · ln_2 input 1 · c_fc input 1 · GELU input 4 · MLP c_proj input 4
# plus, in fp32 whatever the activation dtype: LayerNorm mean and rstd (2 per row, per LayerNorm) and
# the attention's log-sum-exp (one per row per head).
BLOCK_ELEMENTS = {"none": 16, "attn": 11, "mlp": 7}  # attn: the region input + the MLP's 10; mlp: attention's 6 + 1


def activation_bytes(n_layer: int, n_embd: int, n_head: int, vocab_size: int, seq_len: int, batch_size: int, *,
                     policy: str = "none", checkpoint_every: int = 1, bytes_per_element: int = 4, tp: int = 1,
                     sequence_parallel: bool = False) -> dict[str, int]:
    """Bytes of activations saved for backward by labtools.model.GPT (no dropout, fused attention), per rank.

    Parts: "blocks" (all transformer blocks), "outside" (embedding indices, final LayerNorm, LM head and the
    loss's log-softmax, which is fp32), and "total". Exact for fp32 on CPU (tested); with autocast the
    dtype of each saved tensor depends on the op, so treat bytes_per_element as an approximation there.

    tp > 1 (policy "none" or "block"): labtools.parallel.tensor's plan. With tensor parallelism the inputs of the
    LayerNorms and of the column-parallel linears stay whole on every rank (4 of the 16 b·s·h tensors), the
    other 12 are split t ways. With sequence parallelism (DTensor) the LayerNorm inputs and statistics are split
    too, but the all-gathered inputs of c_attn and c_fc are kept whole for their backward: 2 + 14/t.
    (Megatron-LM gathers those again in backward instead, which is how Korthikanti et al. reach 34/t.)
    """
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("vocab_size", vocab_size),
                        ("seq_len", seq_len), ("batch_size", batch_size), ("checkpoint_every", checkpoint_every),
                        ("bytes_per_element", bytes_per_element)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    rows = batch_size * seq_len          # R: one LayerNorm row per token
    E = rows * n_embd                    # elements of one (B, T, C) tensor
    heads = batch_size * n_head * seq_len
    stats = 2 * 4 * rows                 # one LayerNorm's mean and rstd, fp32
    lse = 4 * heads                      # attention log-sum-exp, fp32
    b = bytes_per_element
    if not isinstance(tp, int) or tp < 1 or n_head % tp or n_embd % tp:
        raise ValueError(f"tp must be an int >= 1 dividing n_head ({n_head}) and n_embd ({n_embd}), got {tp!r}")
    if tp > 1 and policy not in ("none", "block"):
        raise ValueError(f"with tp > 1 the policy must be 'none' or 'block', got {policy!r}")
    if policy == "none" and tp > 1:
        whole, split = (2, 14) if sequence_parallel else (4, 12)
        blocks = n_layer * ((whole * E + split * E // tp) * b + 2 * stats // (tp if sequence_parallel else 1)
                            + lse // tp)
    elif policy == "none":
        per_block = 16 * E * b + 2 * stats + lse
        blocks = n_layer * per_block
    elif policy == "block" and tp > 1:
        blocks = n_layer * E * b // (tp if sequence_parallel else 1)
    elif policy == "attn":
        blocks = n_layer * (11 * E * b + stats)
    elif policy == "mlp":
        blocks = n_layer * (7 * E * b + stats + lse)
    elif policy == "block":
        blocks = n_layer * E * b
    elif policy == "every_k":
        blocks = math.ceil(n_layer / checkpoint_every) * E * b
    else:
        raise ValueError(f"policy must be one of ('none', 'block', 'every_k', 'attn', 'mlp'), got {policy!r}")
    outside = (8 * rows + 8 * seq_len      # token and position indices, int64
               + E * b + stats             # final LayerNorm input and statistics
               + E * b                     # LM head input
               + 4 * rows * vocab_size     # log-softmax output, fp32
               + 8 * rows + 4)             # targets (int64) and the loss's total weight
    return {"blocks": blocks, "outside": outside, "total": blocks + outside}


def korthikanti_bytes_per_layer(seq_len: int, batch_size: int, hidden: int, heads: int) -> float:
    """Activation bytes per transformer layer of Korthikanti et al. 2022 ("Reducing Activation Recomputation
    in Large Transformer Models"), eq. 1: s·b·h·(34 + 5·a·s/h), for fp16 activations, dropout masks, and
    attention that keeps its s×s scores."""
    s, b, h, a = seq_len, batch_size, hidden, heads
    return s * b * h * (34 + 5 * a * s / h)


def korthikanti_tp_bytes_per_layer(seq_len: int, batch_size: int, hidden: int, heads: int, tp: int,
                                   sequence_parallel: bool = False) -> float:
    """Korthikanti et al. 2022, eqs. 2 and 4: per layer with tensor parallelism s·b·h·(10 + 24/t + 5as/(ht)),
    and with sequence parallelism as well s·b·h·(34/t + 5as/(ht))."""
    s, b, h, a, t = seq_len, batch_size, hidden, heads, tp
    if sequence_parallel:
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


# --- prediction: the whole budget ------------------------------------------------------------------------

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "lion", "adam8bit")
ZERO_ALIASES = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}  # FSDP's names for ZeRO stages
OFFLOADS = (None, "optimizer", "params", "all")
GRADS = ("param", "fp32", "param+fp32")

# Optimizer state per parameter, in numbers kept per parameter (their dtype follows the precision).
_STATE_NUMBERS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "lion": 1}


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes per GPU (parts, total) and per host for what is offloaded (cpu_parts, cpu_total)."""
    parts: dict
    cpu_parts: dict
    n_params: int
    convention: str

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def cpu_total(self) -> int:
        return sum(self.cpu_parts.values())

    @property
    def model_states(self) -> int:
        """Everything on the GPU except activations (what sharding and offload act on)."""
        return self.total - self.parts.get("activations", 0)

    def bytes_per_param(self) -> float:
        return self.model_states / self.n_params


def _check_int(name: str, value, lo: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")


def estimate(n_params: int, *, precision: str = "bf16-mixed", optimizer: str = "adamw", zero_stage: int | str = 0,
             dp: int = 1, tp: int = 1, pp: int = 1, offload: str | None = None, activations: int | None = None,
             grads: str = "param", param_shapes: list[tuple] | None = None, gathered: int | None = None,
             whole_low_precision_grads: bool = False) -> MemoryBudget:
    """Memory per GPU for training a model of n_params parameters.

    Convention (stated, because published numbers differ by exactly these choices):
    - precision "fp32": weights, gradients and optimizer state in fp32. "bf16-mixed": bf16 weights and
      gradients, an fp32 master copy of the weights, fp32 optimizer state (Micikevicius et al. 2018; the
      ZeRO paper's 2 + 2 + 12 = 16 bytes/param for Adam). "bf16": everything in bf16, no master copy.
    - grads: "param" = gradients in the weights' dtype; "fp32" = accumulated in fp32 instead (mixed
      precision: 18 bytes/param with Adam); "param+fp32" = both, the fp32 copy feeding the optimizer (20).
    - optimizer state: sgd 0, momentum 1, adam/adamw 2, lion 1 numbers per parameter; adam8bit 2 bytes per
      parameter plus one fp32 scale per 2048-element block per moment; adafactor (no momentum) keeps a row
      and a column factor per matrix, which needs param_shapes.
    - zero_stage (or FSDP's NO_SHARD / SHARD_GRAD_OP / FULL_SHARD) shards over the dp ranks: 1 the optimizer
      state and master weights, 2 also the gradients, 3 also the weights (Rajbhandari et al. 2020).
    - tp and pp divide every model state evenly (no replicated layers counted); activations are given per GPU.
    - offload: "optimizer" moves optimizer state and master weights to host memory; "params" moves weights
      and gradients; "all" both. They then appear in cpu_parts (gradients offloaded with the weights; DeepSpeed's
      ZeRO-Offload instead streams gradients to the host optimizer — the same bytes, on the host).
    - ZeRO-3 working set: a unit's weights are gathered whole for its forward and backward and its gradients are
      produced whole before the reduce-scatter, so the GPU also holds one gathered unit: `gathered` parameters ×
      (weight + gradient bytes, weights' dtype) — DeepSpeed's estimator adds 4 × the largest layer (bf16), FSDP
      holds one unit, two while prefetching. Default: the largest of param_shapes if given, else not counted (said
      in .convention). It stays on the GPU when everything else is offloaded.
    - whole_low_precision_grads (ZeRO-2 with grads="param+fp32"): the weights'-dtype gradients backward produces are
      counted whole on every GPU and only their fp32 copy is sharded — DeepSpeed's ZeRO-2 estimator, 4 + 16/N bytes
      per parameter. Default False: the ZeRO paper's 2 + (2 + 12)/N.
    - bytes, not GB: 1 GB = 1e9 bytes here (7B × 16 = 112 GB = 104.3 GiB).
    """
    if not isinstance(n_params, int) or n_params < 1:
        raise ValueError(f"n_params must be a positive int, got {n_params!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if isinstance(zero_stage, str):
        if zero_stage not in ZERO_ALIASES:
            raise ValueError(f"zero_stage must be 0-3 or one of {tuple(ZERO_ALIASES)}, got {zero_stage!r}")
        zero_stage = ZERO_ALIASES[zero_stage]
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3 (or one of {tuple(ZERO_ALIASES)}), got {zero_stage!r}")
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        _check_int(name, value)
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, got {offload!r}")
    if grads not in GRADS:
        raise ValueError(f"grads must be one of {GRADS}, got {grads!r}")
    if grads != "param" and precision == "fp32":
        raise ValueError("grads='fp32' or 'param+fp32' only differ from 'param' for bf16 precisions")
    if activations is not None:
        _check_int("activations", activations, 0)

    w = 4 if precision == "fp32" else 2                     # bytes per weight
    s = 2 if precision == "bf16" else 4                     # bytes per optimizer-state number
    g = {"param": w, "fp32": 4, "param+fp32": w + 4}[grads]  # bytes per gradient
    master = 4 if precision == "bf16-mixed" else 0
    if param_shapes is not None and sum(math.prod(shape) for shape in param_shapes) != n_params:
        raise ValueError(f"param_shapes hold {sum(math.prod(shape) for shape in param_shapes):,} parameters but "
                         f"n_params is {n_params:,}: they must describe the same model")
    if optimizer == "adafactor":
        if param_shapes is None:
            raise ValueError("optimizer='adafactor' needs param_shapes: its state is a row and a column per matrix")
        # a (..., n, m) parameter keeps row statistics (..., n, 1) and column statistics (..., 1, m): one row and
        # one column per leading index, as torch.optim.Adafactor and labtools.optim.Adafactor allocate them
        state_numbers = sum((math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]) if len(shape) >= 2
                            else math.prod(shape) for shape in param_shapes)
        optimizer_bytes = state_numbers * s
    elif optimizer == "adam8bit":
        optimizer_bytes = 2 * n_params + 2 * 4 * math.ceil(n_params / 2048)
    else:
        optimizer_bytes = _STATE_NUMBERS[optimizer] * n_params * s

    shard = tp * pp  # model parallelism splits every model state
    full = {"weights": w * n_params / shard, "gradients": g * n_params / shard,
            "master weights": master * n_params / shard, "optimizer state": optimizer_bytes / shard}
    sharded = {1: ("optimizer state", "master weights"), 2: ("optimizer state", "master weights", "gradients"),
               3: ("optimizer state", "master weights", "gradients", "weights")}.get(zero_stage, ())
    per_gpu = {k: (v / dp if k in sharded else v) for k, v in full.items()}
    moved = {None: (), "optimizer": ("optimizer state", "master weights"), "params": ("weights", "gradients"),
             "all": ("weights", "gradients", "optimizer state", "master weights")}[offload]
    if whole_low_precision_grads:
        if zero_stage != 2 or grads != "param+fp32":
            raise ValueError("whole_low_precision_grads describes ZeRO-2 with grads='param+fp32' (DeepSpeed's "
                             f"estimator), got zero_stage={zero_stage}, grads={grads!r}")
        per_gpu["gradients"] = (w * n_params + 4 * n_params / dp) / shard
    if gathered is None and zero_stage == 3 and param_shapes is not None:
        gathered = max(math.prod(shape) for shape in param_shapes)
    if gathered is not None:
        _check_int("gathered", gathered, 0)
    parts = {k: int(round(v)) for k, v in per_gpu.items() if k not in moved and v}
    cpu_parts = {k: int(round(v)) for k, v in per_gpu.items() if k in moved and v}
    if zero_stage == 3 and gathered:
        parts["gathered unit"] = int(round(2 * w * gathered / shard))
    if activations:
        parts["activations"] = activations
    unit = ("" if zero_stage != 3 else f", gathered unit {gathered:,} params" if gathered
            else ", gathered unit not counted")
    convention = (f"{precision}, {optimizer}, grads {grads}, ZeRO-{zero_stage} over dp={dp}, tp={tp}, pp={pp}"
                  f"{f', offload {offload}' if offload else ''}{unit}")
    return MemoryBudget(parts, cpu_parts, n_params, convention)


@dataclass(frozen=True)
class Architecture:
    n_params: int
    param_shapes: list
    activations: dict  # activation_bytes(...) for the given batch, length and policy


def architecture(n_layer: int, n_embd: int, n_head: int, vocab_size: int, seq_len: int, micro_batch: int, *,
                 checkpoint: str = "none", checkpoint_every: int = 1, bytes_per_element: int = 2,
                 block_size: int | None = None) -> Architecture:
    """Parameters and activations of labtools.model.GPT (GPT-2 style: tied embeddings, biases, 4C MLP).

    Larger published models differ in detail (LLaMA: SwiGLU MLP of 8C/3 with three matrices, RMSNorm, no
    biases, untied output layer); at the same depth and width their parameter count is within a few percent.
    """
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("vocab_size", vocab_size),
                        ("seq_len", seq_len), ("micro_batch", micro_batch)):
        check_range(name, value, 1, None, int)
    if n_embd % n_head:
        raise ValueError(f"n_head ({n_head}) must divide n_embd ({n_embd})")
    T = block_size or seq_len
    C = n_embd
    shapes = [(vocab_size, C), (T, C)]
    for _ in range(n_layer):
        shapes += [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    shapes += [(C,), (C,)]
    n = sum(math.prod(sh) for sh in shapes)
    acts = activation_bytes(n_layer, n_embd, n_head, vocab_size, seq_len, micro_batch, policy=checkpoint,
                            checkpoint_every=checkpoint_every, bytes_per_element=bytes_per_element)
    return Architecture(n, shapes, acts)
