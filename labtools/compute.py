"""The compute budget of a training run: FLOPs, days and dollars, and published runs to check them against.

Pure functions of numbers; every value is *computed*. Lesson 12 measures FLOPs per token with torch's counter
and the machine's peak and MFU beside them.

    training_flops(P, D, n_layer, seq, n_embd)   (6P + 12·L·s·h)·D
    training_seconds(flops, gpus, peak, mfu)     wall time at a model FLOPs utilisation
    training_cost(seconds, gpus, $/GPU-hour)
    training_days(P, D, gpus, X)                 Narayanan et al.'s 8·T·P/(n·X) (they write T for the tokens)
    flops_by_convention(model, seq)              6·P + 12·L·s·h per token with P counted three ways (Convention)

A shape's FLOPs per token are labtools.shapes.ModelShape.flops_per_token; published runs are in labtools.runs.
"""

import math

import torch

from labtools.keys import Key


def training_days(n_params: float, tokens: float, gpus: int, flops_per_gpu: float, recompute: bool = True) -> float:
    """Narayanan et al. 2021, eq. 4: time ≈ 8·T·P / (n·X) with activation recomputation (6·T·P without), in days;
    X is the FLOP/s each GPU achieves end to end."""
    for name, value in (("n_params", n_params), ("tokens", tokens), ("gpus", gpus), ("flops_per_gpu", flops_per_gpu)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    return (8 if recompute else 6) * tokens * n_params / (gpus * flops_per_gpu) / 86400


def _positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def training_flops(n_params: float, tokens: float, *, n_layer: int = 0, seq: int = 0, n_embd: int = 0) -> float:
    """FLOPs to train n_params on `tokens` tokens: 6·N per token (Kaplan et al. 2020: 2N forward, 4N backward),
    plus attention's score and value products, 12·L·T·d per token, when the shape is given (PaLM's appendix B;
    the causal mask's skipped half is counted, as FLOP counters and MFU conventions do). N counts the weights
    that multiply activations: lesson 12 measures which parameters those are."""
    _positive(n_params=n_params, tokens=tokens)
    for name, value in (("n_layer", n_layer), ("seq", seq), ("n_embd", n_embd)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return (6 * n_params + 12 * n_layer * seq * n_embd) * tokens


def training_seconds(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Wall time of a run of `flops` FLOPs on `gpus` GPUs of `peak_flops` FLOP/s each (dense bf16, the vendor's
    figure) at model FLOPs utilisation `mfu` (PaLM's MFU: the model's FLOPs per second ÷ the peak; recomputation
    and any other redundant work is not counted, so it lowers MFU)."""
    _positive(flops=flops, peak_flops=peak_flops)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an int >= 1, got {gpus!r}")
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    return flops / (gpus * peak_flops * mfu)


def training_cost(seconds: float, gpus: int, dollars_per_gpu_hour: float) -> float:
    """Dollars for `gpus` GPUs rented for `seconds`."""
    _positive(seconds=seconds, dollars_per_gpu_hour=dollars_per_gpu_hour)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an int >= 1, got {gpus!r}")
    return seconds / 3600 * gpus * dollars_per_gpu_hour


class Convention(Key):
    """Which parameters N counts in 6·N + 12·L·T·d (the value is the key results are stored under)."""
    MATMUL = "matmul"                            # the weights that multiply activations
    ALL_PARAMETERS = "all_parameters"            # every parameter (picotron's get_mfu)
    NO_TOKEN_EMBEDDING = "no_token_embedding"    # all but the token embedding (torchtitan's get_num_flop_per_token)

    @property
    def label(self) -> str:
        return {"matmul": "matmul weights", "all_parameters": "all parameters (picotron)",
                "no_token_embedding": "without the token embedding (torchtitan)"}[self.value]


def flops_by_convention(model: torch.nn.Module, seq: int) -> dict[Convention, float]:
    """Training FLOPs per token of a labtools.model.GPT by each Convention, all 6·N + 12·L·T·d with a different N.

    MATMUL: 12·L·d² in the blocks plus the head V·d (tied to the token embedding, so it is one matrix used twice: a
        lookup, which costs nothing, and the output product).
    ALL_PARAMETERS: adds the position embedding, biases and LayerNorms, which do no matrix products.
    NO_TOKEN_EMBEDDING: drops the token embedding, which here is also the head, so the output product goes missing.
    """
    c = model.config
    attention = 12 * c.n_layer * seq * c.n_embd
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    total = model.num_params()
    return {Convention.MATMUL: 6 * matmul + attention, Convention.ALL_PARAMETERS: 6 * total + attention,
            Convention.NO_TOKEN_EMBEDDING: 6 * (total - model.transformer.wte.weight.numel()) + attention}
