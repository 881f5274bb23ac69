"""Lesson 22, your turn: the FlashAttention forward kernel's inner loop (scores, the causal mask, the online softmax)
and its end (normalise, store the output and the log-sum-exp), checked against PyTorch's fused attention on four
shapes, one of them ragged; and the key tiles it reads, against the loop bounds a causal kernel needs."""

import inspect
import math

import torch
import torch.nn.functional as F

from labtools import kernels
from labtools.exercises import NOT_WRITTEN, Case, Outcome, attempt, failed
from labtools.learner import is_stub

TOL = 1e-4
HINT = ("for each key tile: scores = q·kᵀ × qk_scale, −inf where a key may not be seen; the new maximum m_new; "
        "p = exp(scores − m_new); l and acc multiplied by exp(m − m_new) before p's sums are added")


def cases() -> list[Case]:
    """(B, H, s, D, causal, BLOCK_Q, BLOCK_K) to try, each with a hint for what it alone tests."""
    return [Case("one head, s = 64, causal, tiles of 16 × 16", (1, 1, 64, 16, True, 16, 16)),
            Case("s = 50, so the last query tile is ragged", (1, 1, 50, 16, True, 16, 16),
                 hint="rows ≥ s of the last tile are padding: store only rows < s (mask=rows < s)"),
            Case("no causal mask, s = 40, tiles of 16 × 32: the last key tile is ragged",
                 (1, 1, 40, 16, False, 16, 32),
                 hint="positions ≥ s are loaded as 0, and a key of 0 scores q·0 = 0, not −inf: mask keys ≥ s"),
            Case("two sequences × two heads, causal, tiles of 32 × 16, s = 48", (2, 2, 48, 32, True, 32, 16),
                 hint="each program reads its own batch × head: every address starts at base = bh · s · D")]


def inputs(B, H, s, D, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, s, D, generator=g).to(kernels.device()) for _ in range(3))


def _learner(kernel):
    """The Python function under a @triton.jit kernel (where it is one)."""
    return getattr(kernel, "fn", kernel)


def check_kernel(kernel) -> Outcome:
    """Your kernel through the lab's launcher on each case: its output against scaled_dot_product_attention, its
    log-sum-exp against the written-out one, and its key tiles read against the loop bounds (exactly)."""
    fn = _learner(kernel)
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    worst = 0.0
    for case in cases():
        B, H, s, D, causal, bq, bk = case.args
        q, k, v = inputs(B, H, s, D)
        tried = attempt(lambda: _unwrapped(kernels.flash_forward, q, k, v, causal=causal, block_q=bq, block_k=bk,
                                           kernel=kernel), case=case.name, hint=case.hint or HINT, whose=fn,
                        seconds=60)
        if not tried.returned:
            return tried.outcome
        f = tried.value
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        d_o = _gap(f.o, want)
        worst = max(worst, d_o)
        if not d_o <= TOL:
            cpu = [t.cpu() for t in (f.o, q, k, v)]
            return failed(case.name, f"the output differs from PyTorch's attention by up to {_num(d_o)} "
                                     f"(first at {_first(f.o, want)})", misconception(*cpu, causal, bq, bk)
                          or case.hint or HINT)
        lse = kernels.reference_lse(q, k, causal=causal)
        d_l = _gap(f.lse, lse)
        worst = max(worst, d_l)
        if not d_l <= TOL:
            return failed(case.name, f"the output is right, but LSE differs from log Σ exp(scores) by up to "
                                     f"{_num(d_l)}", _lse_hint(f.lse.cpu(), lse.cpu()))
        want_tiles = B * H * kernels.tiles_read(s, bq, bk, causal)
        if f.key_tiles_read != want_tiles:
            return failed(case.name, f"the values are right, but the programs read {f.key_tiles_read} key tiles "
                                     f"where the loop bounds need {want_tiles}", _tiles_hint(f.key_tiles_read,
                                                                                            want_tiles, causal))
    return Outcome("pass", f"your kernel equals PyTorch's attention on {len(cases())} shapes, ragged and causal "
                           f"included (largest difference {worst:.0e}), and reads only the key tiles it needs",
                   worst)


_CHECKED: dict = {}  # (the kernel, its source) -> its check's outcome: a notebook asks more than once


def usable(kernel):
    """The learner's kernel where it passes its check, else None (the lab's runs instead)."""
    fn = _learner(kernel)
    key = (id(kernel), _source(fn))
    if key not in _CHECKED:
        _CHECKED[key] = check_kernel(kernel)
    return kernel if _CHECKED[key].passed else None


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _unwrapped(fn, *args, **kwargs):
    """Triton's interpreter wraps an error raised in a kernel: the learner reads their own error, not its wrapper."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        inner = e.__cause__ or e.__context__
        if type(e).__name__ == "InterpreterError" and isinstance(inner, Exception):
            raise inner from None
        raise


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.double() - b.double()).abs()
    return math.inf if not torch.isfinite(d).all() else d.max().item()


def _num(x: float) -> str:
    return "NaN or infinity" if not math.isfinite(x) else f"{x:.3g}"


def _first(got: torch.Tensor, want: torch.Tensor) -> str:
    bad = ((got - want).abs() > TOL) | ~torch.isfinite(got)
    b, h, t, _ = bad.nonzero()[0].tolist()
    return f"sequence {b}, head {h}, query {t}"


def _without_rescale(q, k, v, causal: bool, bk: int) -> torch.Tensor:
    """The online softmax with m updated but l and acc never rescaled: right for one key tile, wrong after."""
    s, D = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) * D ** -0.5
    if causal:
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    m = torch.full(scores.shape[:-1], float("-inf"))
    l, acc = torch.zeros(scores.shape[:-1]), torch.zeros_like(q)
    for start in range(0, s, bk):
        tile = scores[..., start:start + bk]
        m = torch.maximum(m, tile.amax(-1))
        p = torch.exp(tile - m[..., None]).nan_to_num(0.0)
        l, acc = l + p.sum(-1), acc + p @ v[..., start:start + bk, :]
    return acc / l[..., None]


def misconception(o, q, k, v, causal: bool, bq: int, bk: int) -> str:
    """The typical mistake the output matches, in words ("" if none)."""
    s, D = q.shape[-2], q.shape[-1]
    rows, keys = torch.arange(s)[:, None], torch.arange(s)[None, :]
    tile_end = (rows // bq + 1) * bq  # a query sees every key before its tile's end: the skip without the mask
    pad = 0 if causal else -s % bk  # under the causal mask a padded key comes after every query: masked anyway
    zero_keys = torch.cat([k, torch.zeros(*k.shape[:-2], pad, D)], -2)
    zero_vals = torch.cat([v, torch.zeros(*v.shape[:-2], pad, D)], -2)
    known = {
        "scores are q·kᵀ times qk_scale (1/√d_h), before the softmax": F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=1.0),
        "under CAUSAL, a key after its query must get −inf before the maximum and the exponent":
            F.scaled_dot_product_attention(q, k, v),
        "inside a query tile's last key tile, a key after its query must still get −inf: skipping later tiles is "
        "not the whole causal mask": (F.scaled_dot_product_attention(q, k, v, attn_mask=keys < tile_end)
                                      if causal else None),
        "positions ≥ s are loaded as 0 and score q·0 = 0: mask keys ≥ s to −inf, as the causal ones": (
            F.scaled_dot_product_attention(q, zero_keys, zero_vals) if pad else None),
        "when a tile raises a query's maximum, the sums so far were taken against the old one: multiply l and acc "
        "by exp(m − m_new) before adding the tile's": _without_rescale(q, k, v, causal, bk),
    }
    for what, expected in known.items():
        if expected is not None and torch.allclose(o, expected, atol=1e-4, equal_nan=False):
            return what
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if torch.isfinite(o).all() and not torch.allclose(o, want, atol=1e-3) and _proportional(o, want):
        return "each output row is a weighted sum whose weights must sum to 1: divide acc by l at the end"
    if not torch.isfinite(o).all():
        return ("exp(−inf − (−inf)) is NaN: take the new maximum over the old one and the tile's (tl.maximum), "
                "so that it is finite once any key was seen")
    return ""


def _proportional(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Each row of a is a positive multiple of b's row (an output left unnormalised)."""
    ratio = (a * b).sum(-1) / (b * b).sum(-1).clamp(min=1e-12)
    return torch.allclose(a, ratio[..., None] * b, atol=1e-3) and bool((ratio > 0).all())


def _lse_hint(got: torch.Tensor, want: torch.Tensor) -> str:
    if torch.allclose(got / math.log2(math.e), want, atol=1e-3) or torch.allclose(got * math.log(2), want,
                                                                                   atol=1e-3):
        return "LSE is in natural logarithms (tl.log), as the backward recomputes p = exp(score − LSE)"
    return "LSE is m + log(l): the largest score plus the log of the sum of exp(score − m), one per query"


def _tiles_hint(got: int, want: int, causal: bool) -> str:
    if got == 0:
        return "keep the tl.atomic_add line inside the loop: it counts the key tiles each program reads"
    if causal and got > want:
        return ("under CAUSAL, key tiles after the query tile's last query are all masked: end the loop at "
                "min(s, (tile + 1) · BLOCK_Q) and never read them")
    return "read each key tile once: the loop runs from 0 to its end in steps of BLOCK_K"


def solution_source() -> str:
    """The lab's kernel as the learner's cell would hold it (decorated, under the learner's name)."""
    src = inspect.getsource(kernels.flash_forward_kernel.fn)
    return src.replace("def flash_forward_kernel(", "def my_flash_forward(")
