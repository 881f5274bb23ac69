"""Number formats, their bits, and a dynamic loss scaler written from scratch.

FORMATS is computed from each format's exponent and mantissa widths by bit arithmetic (and
checked against torch.finfo in tests): for an IEEE-style format with e exponent bits and m
mantissa bits, bias = 2^(e-1) - 1, smallest normal = 2^(1-bias), smallest subnormal =
2^(1-bias-m), eps = 2^-m, largest = (2 - 2^-m) * 2^(2^e - 2 - bias). fp8 e4m3fn spends the
all-ones exponent on numbers (only all-ones mantissa is NaN, no inf), so its largest is
1.75 * 2^8 = 448. TF32 is not a storage type: tensor cores round fp32 inputs to 10 mantissa bits.

`decompose(x, fmt)` shows the bits of the value a format actually stores for x, using integer
views of the tensor (no string tricks), and rebuilds the value from those bits.

`DynamicLossScaler` is the rule torch.amp.GradScaler implements, in plain Python: multiply the
loss by S; after backward divide the gradients by S and look for inf/nan; skip the step and
halve S if any, otherwise step and double S after `growth_interval` clean steps.
Introduced in notebooks/04_mixed_precision.ipynb.
"""

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    name: str
    exp_bits: int
    mantissa_bits: int
    dtype: torch.dtype | None   # None: not a storage type (tf32)
    has_inf: bool = True        # False: fp8 e4m3fn (all-ones exponent is finite, all-ones mantissa there is NaN)

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def max(self) -> float:
        if self.has_inf:
            return (2 - 2.0**-self.mantissa_bits) * 2.0 ** (2**self.exp_bits - 2 - self.bias)
        return (2 - 2.0 ** (1 - self.mantissa_bits)) * 2.0 ** (2**self.exp_bits - 1 - self.bias)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Gap between 1 and the next representable number."""
        return 2.0**-self.mantissa_bits

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits: log10 of 2^(mantissa bits + the implicit one)."""
        return (self.mantissa_bits + 1) * math.log10(2)


FORMATS = {
    "fp32": Format("fp32", 8, 23, torch.float32),
    "tf32": Format("tf32", 8, 10, None),
    "bf16": Format("bf16", 8, 7, torch.bfloat16),
    "fp16": Format("fp16", 5, 10, torch.float16),
    "fp8_e4m3": Format("fp8_e4m3", 4, 3, torch.float8_e4m3fn, has_inf=False),
    "fp8_e5m2": Format("fp8_e5m2", 5, 2, torch.float8_e5m2),
}

_INT_VIEW = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


@dataclass(frozen=True)
class Decomposition:
    format: str
    x: float               # the number asked for
    stored: float          # the value the format holds for it (torch's rounding; fp8 e4m3 saturates at 448)
    rebuilt: float         # the value computed back from sign, exponent and mantissa fields
    bits: str              # "s eeeee mmmmmmmmmm"
    sign: int
    exponent_field: int
    mantissa_field: int
    exponent: int | None   # unbiased exponent (None for zero, inf, nan)
    category: str          # "zero", "subnormal", "normal", "inf", "nan"

    @property
    def abs_error(self) -> float:
        return abs(self.stored - self.x) if math.isfinite(self.stored) else math.inf

    @property
    def rel_error(self) -> float:
        return self.abs_error / abs(self.x) if self.x else (0.0 if self.stored == 0 else math.inf)


def _round_to_tf32(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 to 10 mantissa bits, nearest-even, the way tensor cores read tf32 inputs."""
    i = v.view(torch.int32)
    keep = torch.isfinite(v)
    lsb = (i >> 13) & 1
    rounded = ((i + 0xFFF + lsb) & ~0x1FFF).view(torch.float32)
    return torch.where(keep, rounded, v)


def _fields_to_value(fmt: Format, sign: int, e: int, m: int) -> tuple[float, int | None, str]:
    all_ones = 2**fmt.exp_bits - 1
    s = -1.0 if sign else 1.0
    if e == all_ones and fmt.has_inf:
        return (s * math.inf, None, "inf") if m == 0 else (math.nan, None, "nan")
    if e == all_ones and not fmt.has_inf and m == 2**fmt.mantissa_bits - 1:
        return math.nan, None, "nan"
    if e == 0:
        if m == 0:
            return s * 0.0, None, "zero"
        return s * math.ldexp(m, 1 - fmt.bias - fmt.mantissa_bits), 1 - fmt.bias, "subnormal"
    return s * math.ldexp(2**fmt.mantissa_bits + m, e - fmt.bias - fmt.mantissa_bits), e - fmt.bias, "normal"


def decompose(x: float, fmt: str) -> Decomposition:
    """The bits of x stored in format `fmt` (a key of FORMATS), the stored value and its error."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FORMATS)}, got {fmt!r}")
    f = FORMATS[fmt]
    t = torch.tensor([float(x)], dtype=torch.float64)
    if f.dtype is None:  # tf32: round an fp32 value's mantissa, read its top 19 bits
        v = _round_to_tf32(t.to(torch.float32))
        raw = (v.view(torch.int32).item() & 0xFFFFFFFF) >> 13
        stored = v.item()
    else:
        v = t.to(f.dtype)
        raw = v.view(_INT_VIEW[f.bits]).item() & (2**f.bits - 1)
        stored = v.to(torch.float64).item()
    m_bits = f.mantissa_bits
    sign, e, m = raw >> (f.bits - 1), (raw >> m_bits) & (2**f.exp_bits - 1), raw & (2**m_bits - 1)
    rebuilt, exponent, category = _fields_to_value(f, sign, e, m)
    b = format(raw, f"0{f.bits}b")
    return Decomposition(fmt, float(x), stored, rebuilt, f"{b[0]} {b[1:1 + f.exp_bits]} {b[1 + f.exp_bits:]}", sign,
                         e, m, exponent, category)


class DynamicLossScaler:
    """A from-scratch dynamic loss scaler with torch.amp.GradScaler's interface and update rule.

        scale(loss)      loss · S, so small gradients stay above fp16's underflow
        unscale_(opt)    g ← g / S for every gradient; found_inf = any inf/nan among them
        step(opt)        unscale_ if not done yet; skip optimizer.step() when found_inf
        update()         found_inf: S ← S · backoff_factor, restart the count;
                         else count += 1 and, after growth_interval clean steps, S ← S · growth_factor
    growth_factor = backoff_factor = 1 gives a static scale that still skips non-finite steps.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        if init_scale <= 0 or growth_factor < 1 or not 0 < backoff_factor <= 1 or growth_interval < 1:
            raise ValueError("need init_scale > 0, growth_factor >= 1, 0 < backoff_factor <= 1, growth_interval >= 1; "
                             f"got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}")
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._enabled = enabled
        self._growth_tracker = 0
        self._found_inf = False
        self._unscaled = False
        self.skipped_steps = 0

    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale if self._enabled else loss

    @torch.no_grad()
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._enabled:
            return
        if self._unscaled:
            raise RuntimeError("unscale_() was already called since the last update()")
        inv = torch.tensor(self._scale, dtype=torch.float64).reciprocal().float()  # 1/S in fp32, as torch does
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(inv)
                    found = found or not torch.isfinite(p.grad).all().item()
        self._found_inf, self._unscaled = found, True

    def step(self, optimizer: torch.optim.Optimizer):
        if not self._enabled:
            return optimizer.step()
        if not self._unscaled:
            self.unscale_(optimizer)
        if self._found_inf:
            self.skipped_steps += 1
            return None
        return optimizer.step()

    def update(self) -> None:
        if not self._enabled:
            return
        if self._found_inf:
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._found_inf, self._unscaled = False, False
