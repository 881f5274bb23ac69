"""FP8 matmuls as training uses them: a tensor divided by a scale so that its largest magnitude lands on the
format's largest value, stored in float8, and multiplied back after the product. The scale is one per tensor
(tensorwise), per row (rowwise), or per block of the tensor (DeepSeek-V3, 2024, section 3.3: 1 × 128 tiles of
activations and gradients, 128 × 128 blocks of weights). Micikevicius et al. (2022, "FP8 Formats for Deep Learning")
gave e4m3 (more precision) to activations and weights and e5m2 (more range) to gradients; DeepSeek-V3 used e4m3 for
every tensor, its fine-grained scales standing in for the range.

Here the matmuls quantise and dequantise (QDQ): the values are exactly those an FP8 matmul multiplies, the
product is taken in float32. torch._scaled_mm multiplies the float8 tensors themselves (tests/test_kernels.py
checks that both give the same product); on a GPU with FP8 units it is the fast one.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
EPS = 1e-12  # the smallest amax a scale is made from: an all-zero block gets a finite scale, not 0/0


@dataclass(frozen=True)
class Scaling:
    """How a 2-D tensor is cut into blocks that each get one scale: rows × cols, None meaning the whole dimension."""
    name: str
    rows: int | None
    cols: int | None

    def block(self, shape: tuple[int, int]) -> tuple[int, int]:
        m, n = shape
        r, c = self.rows or m, self.cols or n
        if m % r or n % c:
            raise ValueError(f"{self.name} scaling cuts blocks of {r} × {c}: the tensor's shape {tuple(shape)} must "
                             "divide by them")
        return r, c


TENSORWISE = Scaling("tensorwise", None, None)
ROWWISE = Scaling("rowwise", 1, None)
TILES = Scaling("groups of 128", 1, 128)       # DeepSeek-V3's 1 × 128 tiles: activations and gradients
BLOCKS = Scaling("128 × 128 squares", 128, 128)  # its 128 × 128 blocks: weights
SCALINGS = {s.name: s for s in (TENSORWISE, ROWWISE, TILES, BLOCKS)}


@dataclass(frozen=True)
class Quantised:
    data: torch.Tensor     # the float8 values, x's shape
    scales: torch.Tensor   # float32, one per block: (rows ÷ block rows, cols ÷ block cols)
    block: tuple[int, int]

    def dequantise(self) -> torch.Tensor:
        r, c = self.block
        return self.data.float() * self.scales.repeat_interleave(r, 0).repeat_interleave(c, 1)


def quantise(x: torch.Tensor, block: tuple[int, int], fmt: str = "e4m3") -> Quantised:
    """x (M, N) in blocks of block = (r, c): each block divided by max(|block|) ÷ the format's largest value, then
    rounded to float8."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    m, n = x.shape
    r, c = block
    if m % r or n % c:
        raise ValueError(f"blocks of {r} × {c} must divide the tensor's shape {tuple(x.shape)}")
    dtype = FORMATS[fmt]
    blocks = x.float().reshape(m // r, r, n // c, c)
    amax = blocks.abs().amax(dim=(1, 3))
    scales = amax.clamp(min=EPS) / torch.finfo(dtype).max
    data = (blocks / scales[:, None, :, None]).to(dtype).reshape(m, n)
    return Quantised(data, scales, (r, c))


def qdq(x: torch.Tensor, scaling: Scaling, fmt: str = "e4m3") -> torch.Tensor:
    """x as an FP8 matmul sees it: quantised with `scaling`'s blocks, then multiplied back (any leading dims are
    flattened into rows)."""
    flat = x.reshape(-1, x.shape[-1])
    return quantise(flat, scaling.block(tuple(flat.shape)), fmt).dequantise().reshape(x.shape).to(x.dtype)


def unscaled(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x cast to float8 and back with no scale: what a recipe without scaling stores."""
    return x.to(FORMATS[fmt]).float()


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖ / ‖exact‖ (Frobenius)."""
    return ((approx.double() - exact.double()).norm() / exact.double().norm()).item()


@dataclass(frozen=True)
class Recipe:
    """What a linear layer's matmuls see: inputs and weights in `forward` (e4m3), the output's gradient in
    `backward` (e5m2), each scaled as its Scaling says (None: cast with no scale). "bf16" rounds to bfloat16 instead,
    as autocast's matmuls take their inputs. quantiser(x, rows, cols) -> (float8 data, scales) replaces `quantise`
    (the learner's, in lesson 22)."""
    name: str
    inputs: Scaling | None
    weights: Scaling | None
    grads: Scaling | None
    forward: str = "e4m3"
    backward: str = "e5m2"
    quantiser: Callable | None = None

    def see(self, x: torch.Tensor, scaling: Scaling | None, fmt: str) -> torch.Tensor:
        if fmt == "bf16":
            return x.to(torch.bfloat16).to(x.dtype)
        if scaling is None:
            return unscaled(x, fmt).to(x.dtype)
        if self.quantiser is None:
            return qdq(x, scaling, fmt)
        flat = x.reshape(-1, x.shape[-1])
        block = scaling.block(tuple(flat.shape))
        data, scales = self.quantiser(flat, *block) if fmt == "e4m3" else _as_pair(quantise(flat, block, fmt))
        return Quantised(data, scales, block).dequantise().reshape(x.shape).to(x.dtype)


def _as_pair(q: Quantised) -> tuple[torch.Tensor, torch.Tensor]:
    return q.data, q.scales


RECIPES = {
    "bf16": Recipe("bf16", None, None, None, "bf16", "bf16"),
    "tensorwise": Recipe("tensorwise", TENSORWISE, TENSORWISE, TENSORWISE),
    "rowwise": Recipe("rowwise", ROWWISE, ROWWISE, ROWWISE),
    "hybrid_blockwise": Recipe("hybrid_blockwise", TILES, BLOCKS, TILES),  # the block scales, gradients in e5m2
    "blockwise": Recipe("blockwise", TILES, BLOCKS, TILES, "e4m3", "e4m3"),  # DeepSeek-V3's: e4m3 everywhere
    "unscaled": Recipe("unscaled", None, None, None),        # FP8 with no scale: what scaling is for
    "unscaled_e4m3": Recipe("unscaled_e4m3", None, None, None, "e4m3", "e4m3"),  # DeepSeek-V3's formats, no scales
}


class _QDQLinear(torch.autograd.Function):
    """y = Q(x) Q(W)ᵀ; backward with Q(dy) in e5m2, against the same quantised x and W (a weight's scales are per
    its own rows, the output channels, as a rowwise GEMM takes them)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe):
        xq, wq = recipe.see(x, recipe.inputs, recipe.forward), recipe.see(weight, recipe.weights, recipe.forward)
        ctx.save_for_backward(xq, wq)
        ctx.recipe, ctx.has_bias = recipe, bias is not None
        y = xq @ wq.t()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        g = ctx.recipe.see(dy, ctx.recipe.grads, ctx.recipe.backward)
        g2, x2 = g.reshape(-1, g.shape[-1]), xq.reshape(-1, xq.shape[-1])
        db = g2.sum(0) if ctx.has_bias else None
        return g @ wq, g2.t() @ x2, db, None


class FP8Linear(nn.Module):
    """An nn.Linear whose matmuls see FP8 values (quantise-dequantise), as `recipe` scales them."""

    def __init__(self, linear: nn.Linear, recipe: Recipe):
        super().__init__()
        self.weight, self.bias, self.recipe = linear.weight, linear.bias, recipe

    def forward(self, x):
        return _QDQLinear.apply(x, self.weight, self.bias, self.recipe)


def use_fp8(model: nn.Module, recipe: Recipe, keep: tuple[str, ...] = ("lm_head",)) -> nn.Module:
    """Every nn.Linear of the model's blocks through FP8 (in place); the embeddings and the output head stay in
    high precision, as DeepSeek-V3 keeps them."""
    for name, module in list(model.named_modules()):
        for child, layer in list(module.named_children()):
            full = f"{name}.{child}" if name else child
            if isinstance(layer, nn.Linear) and not any(full.endswith(k) for k in keep):
                setattr(module, child, FP8Linear(layer, recipe))
    return model
