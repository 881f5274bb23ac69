"""Lesson 22, your turn: the fine-grained FP8 quantiser (DeepSeek-V3's 1 × 128 tiles and 128 × 128 blocks, called
groups of 128 and squares in the lesson, whose tiles are the attention kernel's), checked against the lab's: the scales
to float32 rounding, the float8 values exactly. Then it quantises section 5's fine-grained training run
(fp8_training.with_yours)."""

import inspect

import torch

from labtools import fp8
from labtools.exercises import Case, Outcome, attempt, failed
from labtools.learner import is_stub

E4M3 = torch.float8_e4m3fn
HINT = ("for each rows × cols piece: scale = max(|piece|, 1e-12) ÷ 448 (e4m3's largest value); the piece divided "
        "by its scale, cast to torch.float8_e4m3fn")


def reference(x, rows, cols):  # the solution shown; the check compares with labtools.fp8.quantise
    """x (M, N) float32 cut into pieces of rows × cols: the float8 values (M, N) and one scale per piece
    (M ÷ rows, N ÷ cols)."""
    M, N = x.shape
    pieces = x.reshape(M // rows, rows, N // cols, cols)              # piece (i, j) is pieces[i, :, j, :]
    amax = pieces.abs().amax(dim=(1, 3))                              # its largest magnitude
    scales = amax.clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    data = (pieces / scales[:, None, :, None]).to(torch.float8_e4m3fn)
    return data.reshape(M, N), scales


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    act = torch.randn(4, 256, generator=g) * torch.logspace(-2, 1, 256)[None, :]   # channels of unlike sizes
    weight = torch.randn(256, 256, generator=g) * 0.02
    zeros = torch.randn(2, 256, generator=g)
    zeros[1, 128:] = 0.0
    negative = torch.rand(3, 128, generator=g)
    negative[1, 5] = -40.0
    return [Case("activations (4 × 256) in groups of 128", (act, 1, 128)),
            Case("a weight (256 × 256) in 128 × 128 squares", (weight, 128, 128),
                 hint="a piece is rows × cols: rows of the tensor, then columns; one scale per piece"),
            Case("a group of zeros beside others", (zeros, 1, 128),
                 hint="an all-zero group has amax 0, so 0 ÷ 0 is NaN: clamp amax to at least 1e-12 first"),
            Case("a group whose largest magnitude is negative", (negative, 1, 128),
                 hint="the scale comes from the largest magnitude, |x|, not the largest value")]


def check_quantiser(fn) -> Outcome:
    if is_stub(fn):
        return attempt(fn, *cases()[0].args).outcome
    worst = 0.0
    for case in cases():
        x, rows, cols = case.args
        tried = attempt(fn, x.clone(), rows, cols, case=case.name, hint=case.hint or HINT)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if not (isinstance(got, tuple) and len(got) == 2 and all(torch.is_tensor(t) for t in got)):
            return failed(case.name, f"returned {type(got).__name__}, expected a pair: (float8 values, scales)", HINT)
        data, scales = got
        lab = fp8.quantise(x, (rows, cols), "e4m3")
        want_data, want_scales = lab.data, lab.scales
        if scales.shape != want_scales.shape:
            return failed(case.name, f"{tuple(scales.shape)} scales, expected one per {rows} × {cols} piece: shape "
                                     f"{tuple(want_scales.shape)}", case.hint or HINT)
        if data.dtype != E4M3:
            return failed(case.name, f"the values are {data.dtype}, expected torch.float8_e4m3fn",
                          "activations and weights go to e4m3 (more precision); e5m2 is the gradients' format")
        if not torch.isfinite(scales).all():
            return failed(case.name, "a scale is NaN or infinite", cases()[2].hint)
        rel = ((scales.double() - want_scales.double()).abs() / want_scales.double()).max().item()
        worst = max(worst, rel)
        if not rel <= 1e-6:
            return failed(case.name, f"a scale differs from the lab's by up to {rel:.3g} of it (first at piece "
                                     f"{_first_block(scales, want_scales)})", misconception(x, rows, cols, scales)
                          or case.hint or HINT)
        same = data.float() == want_data.float()
        if not same.all():
            r, c = (~same).nonzero()[0].tolist()
            return failed(case.name, f"the scales are right, but the float8 value at ({r}, {c}) is "
                                     f"{data[r, c].item():g} where the lab's is {want_data[r, c].item():g}",
                          "divide each value by its piece's scale (do not multiply), then cast")
    scales_as = "exactly" if worst == 0 else f"to {worst:.0e} of themselves"
    return Outcome("pass", f"your quantiser equals the lab's on {len(cases())} tensors: the scales {scales_as}, and "
                           "every float8 value", worst)


def _first_block(got: torch.Tensor, want: torch.Tensor) -> str:
    bad = ~torch.isclose(got.double(), want.double(), rtol=1e-6, atol=0.0)
    i, j = bad.nonzero()[0].tolist()
    return f"({i}, {j})"


def misconception(x, rows, cols, scales) -> str:
    M, N = x.shape
    blocks = x.reshape(M // rows, rows, N // cols, cols)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    known = {
        "the scale is amax ÷ 448, so that values ÷ scale reach 448; 448 ÷ amax is its inverse": 448 / amax,
        "the scale comes from the largest magnitude, |x|, not the largest value":
            blocks.amax(dim=(1, 3)).clamp(min=1e-12) / 448,
        "one scale per piece, not one for the whole tensor": (x.abs().max() / 448).expand_as(amax),
        "448 is e4m3's largest value; 57344 is e5m2's": amax / 57344,
    }
    for what, v in known.items():
        if v.shape == scales.shape and torch.allclose(scales.double(), v.double(), rtol=1e-5):
            return what
    return ""


def solution_source() -> str:
    return inspect.getsource(reference).replace("def reference(", "def my_quantise(")

