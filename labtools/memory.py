"""Memory: measure what training holds, and predict it from the architecture.

Measurement (any device):
    saved_activation_bytes   bytes of tensors autograd saves for backward during a forward pass
                             (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage,
                             parameters excluded); agrees with torch's MemTracker to a few bytes
    model_state_bytes        parameters, gradients and optimizer state, from the tensors themselves
    peak_bytes               the peak of one training step split by kind (torch's MemTracker; CPU and CUDA)
    cuda_peak_bytes          the CUDA allocator's peak around a call

Prediction:
    activation_bytes         saved activations of labtools.model.GPT from its shape and checkpoint policy,
                             derived by listing what each op of our block saves (notebook 05)

Introduced in notebooks/05_activation_checkpointing.ipynb.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

# --- measurement -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedTensor:
    shape: tuple
    dtype: torch.dtype
    nbytes: int  # bytes of the whole storage it lives in (counted once per storage)


def saved_activations(fn: Callable[[], object], exclude: list[torch.Tensor] = ()) -> tuple[list[SavedTensor], object]:
    """Run fn() and list the tensors autograd saved for backward, one per storage, skipping `exclude` (parameters)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, SavedTensor] = {}

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in skip and key not in seen:
            seen[key] = SavedTensor(tuple(t.shape), t.dtype, storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return list(seen.values()), out


def saved_activation_bytes(model: nn.Module, X: torch.Tensor, Y: torch.Tensor | None = None) -> int:
    """Bytes autograd keeps for the backward of model(X, Y): the activation memory of a training step."""
    saved, _ = saved_activations(lambda: model(X, Y), exclude=list(model.parameters()))
    return sum(s.nbytes for s in saved)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of parameters, of gradients (those present) and of optimizer state tensors, measured."""
    params = list(model.parameters())
    out = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params), "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = sum(tensor_bytes(v for v in s.values() if torch.is_tensor(v))
                               for s in optimizer.state.values())
    return out


def peak_bytes(step: Callable[[], None], model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Peak memory of step() by kind (params, grads, activations, temporaries, optimizer state, total) on the
    model's device, from torch's MemTracker (torch.distributed._tools: a private API, present since torch 2.5)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(*(m for m in (model, optimizer) if m is not None))
    with tracker:
        step()
    snapshot = tracker.get_tracker_snapshot("peak")
    device = next(model.parameters()).device
    stats = next(v for k, v in snapshot.items() if torch.device(k).type == device.type)
    names = {"PARAM": "params", "GRAD": "grads", "ACT": "activations", "TEMP": "temp", "OPT": "optimizer"}
    out = {names[str(k).split(".")[-1]]: v for k, v in stats.items() if str(k).split(".")[-1] in names}
    out["total"] = stats["Total"]
    return out


def cuda_peak_bytes(fn: Callable[[], None]) -> int:
    """The CUDA allocator's peak during fn(), above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


# --- prediction: activations ------------------------------------------------------------------------------

# What each op of labtools.model.Block saves for backward, in elements of a (B, T, C) tensor, for
# fused attention (flash / memory-efficient SDPA, which does not keep the T×T matrix) and no dropout:
#   ln_1 input 1 · c_attn input 1 · q, k, v 3 (one storage) · attention output 1 (it is also c_proj's
#   input: the transpose back is free) · ln_2 input 1 · c_fc input 1 · GELU input 4 · MLP c_proj input 4
# plus, in fp32 whatever the activation dtype: LayerNorm mean and rstd (2 per row, per LayerNorm) and
# the attention's log-sum-exp (one per row per head).
BLOCK_ELEMENTS = {"none": 16, "attn": 11, "mlp": 7}  # attn: the region input + the MLP's 10; mlp: attention's 6 + 1


def activation_bytes(n_layer: int, n_embd: int, n_head: int, vocab_size: int, seq_len: int, batch_size: int, *,
                     policy: str = "none", checkpoint_every: int = 1, bytes_per_element: int = 4) -> dict[str, int]:
    """Bytes of activations saved for backward by labtools.model.GPT (no dropout, fused attention).

    Parts: "blocks" (all transformer blocks), "outside" (embedding indices, final LayerNorm, LM head and the
    loss's log-softmax, which is fp32), and "total". Exact for fp32 on CPU (tested); with autocast the
    dtype of each saved tensor depends on the op, so treat bytes_per_element as an approximation there.
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
    if policy == "none":
        per_block = 16 * E * b + 2 * stats + lse
        blocks = n_layer * per_block
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
