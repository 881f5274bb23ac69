"""Learning-rate schedules as pure functions of the step, returning a multiplier of the peak LR.

Every function maps an integer step (0-based) to a float in [0, 1]; the training loop sets
lr = peak_lr * schedule(step) before each optimizer step (nanoGPT's get_lr pattern).
Linear warmup is step / warmup for step < warmup, so step 0 takes no step at all.

    constant        1
    linear_warmup   step/warmup, then 1
    warmup_cosine   warmup, then min + (1 - min) * (1 + cos(pi * p)) / 2, p = progress through the decay
    warmup_linear   warmup, then 1 - (1 - min) * p
    wsd             warmup, a stable phase at 1, then a cosine, linear or 1 - sqrt decay to min (the schedule: Hu et
                    al. 2024, MiniCPM, whose decay is exponential; linear and 1 - sqrt cool-downs: Hägele et al. 2024)

After the end of a decay the multiplier stays at min_ratio. Introduced in notebooks/02_lr_schedules.ipynb.
"""

import functools
import math
from typing import Callable

SHAPES = ("cosine", "linear", "1-sqrt")  # decay shapes of wsd


def _check(name: str, value: int, lo: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")


def _check_ratio(min_ratio: float) -> None:
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio!r}")


def _decay(p: float, min_ratio: float, shape: str) -> float:
    """Multiplier at progress p in [0, 1] through a decay from 1 to min_ratio."""
    p = min(max(p, 0.0), 1.0)
    if shape == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    if shape == "1-sqrt":  # Hägele et al. 2024: falls fastest at the start of the cool-down
        return min_ratio + (1.0 - min_ratio) * (1.0 - math.sqrt(p))
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")


def constant(step: int) -> float:
    """1.0 at every step."""
    return 1.0


def linear_warmup(step: int, *, warmup: int) -> float:
    """step / warmup for step < warmup, then 1."""
    _check("warmup", warmup)
    if step < warmup:
        return step / warmup
    return 1.0


def _warmup_then_decay(step: int, warmup: int, total: int, min_ratio: float, shape: str) -> float:
    _check("warmup", warmup)
    _check("total", total, warmup + 1)
    _check_ratio(min_ratio)
    if step < warmup:
        return step / warmup
    return _decay((step - warmup) / (total - warmup), min_ratio, shape)


def warmup_cosine(step: int, *, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """Linear warmup, then a half-cosine from 1 at `warmup` to min_ratio at `total`."""
    return _warmup_then_decay(step, warmup, total, min_ratio, "cosine")


def warmup_linear(step: int, *, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """Linear warmup, then a straight line from 1 at `warmup` to min_ratio at `total`."""
    return _warmup_then_decay(step, warmup, total, min_ratio, "linear")


def wsd(step: int, *, warmup: int, stable: int, decay: int, min_ratio: float = 0.0, shape: str = "cosine") -> float:
    """Warmup-stable-decay: warmup, `stable` steps at 1, then `decay` steps down to min_ratio."""
    _check("warmup", warmup)
    _check("stable", stable)
    _check("decay", decay, 1)
    _check_ratio(min_ratio)
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    if step < warmup:
        return step / warmup
    if step < warmup + stable:
        return 1.0
    return _decay((step - warmup - stable) / decay, min_ratio, shape)


def bind(fn: Callable[..., float], **kwargs) -> Callable[[int], float]:
    """fn with its keyword arguments fixed: a step -> multiplier function for TrainConfig.lr_schedule."""
    fn(0, **kwargs)  # validate the arguments now, not at the first training step
    return functools.partial(fn, **kwargs)

