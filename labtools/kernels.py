"""FlashAttention written in Triton: the forward (tiles of queries against tiles of keys, the online softmax, causal
tiles skipped), the backward that recomputes each tile's probabilities from the saved log-sum-exp, an autograd
Function that a GPT's attention can call, and the bytes each way of computing attention moves (Dao et al. 2022,
"FlashAttention"; Dao 2023, "FlashAttention-2": the loop order here, queries outside, keys inside).

Written by hand because the kernel is what lesson 22 teaches; its check is torch's scaled_dot_product_attention.
Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before any kernel is made):
numpy executes each program of the grid in turn, so results are exact and times say nothing about a GPU.

Layout: q, k, v are (B, H, s, D) as for scaled_dot_product_attention; a kernel sees them as (B·H, s, D), one
program per (query tile, batch × head).
"""

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():  # read when each kernel below is made (triton.jit), so before them
    os.environ.setdefault("TRITON_INTERPRET", "1")
# tl.dot on float32 in full precision, as PyTorch's attention computes it (a GPU's default, TF32, keeps 10 bits of
# mantissa: differences of about 1e-3, where the checks here allow 1e-4)
os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

try:
    import triton  # noqa: E402
except ImportError as e:  # requirements.txt installs it on Linux only: PyPI has no other wheel
    raise ImportError("lesson 22's kernels need Triton, which PyPI provides for Linux only: run this lesson on Linux "
                      "(a Linux machine, container or WSL), where `make lab` installs it") from e
import triton.language as tl  # noqa: E402
from triton.language import standard as _standard  # noqa: E402


def interpreted() -> bool:
    """True where the kernels run in Triton's interpreter (on the CPU) rather than compiled for a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


if interpreted() and type(_standard.cdiv).__name__ != "InterpretedFunction":  # made before the variable was set
    raise RuntimeError("Triton was imported before labtools.kernels set TRITON_INTERPRET=1, so its own functions "
                       "cannot run on the CPU: import labtools.kernels before triton (or restart the kernel)")

BLOCKS = (16, 32, 64, 128)  # tile sizes a kernel takes: powers of two, and tl.dot needs at least 16


def device() -> torch.device:
    """Where the kernels' tensors must live: the GPU they compile for, or the CPU the interpreter runs on."""
    return torch.device("cpu" if interpreted() else "cuda")


@triton.jit
def flash_forward_kernel(Q, K, V, O, LSE, SEEN, s, qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: BLOCK_Q queries of one batch × head against every key tile they may see. SEEN counts the key
    tiles each program read (one int32 per program)."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)
    cols = tl.arange(0, D)
    base = bh * s * D
    q = tl.load(Q + base + rows[:, None] * D + cols[None, :], mask=rows[:, None] < s, other=0.0)
    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)   # each query's largest score so far
    l = tl.zeros([BLOCK_Q], tl.float32)                 # its sum of exp(score − m) so far
    acc = tl.zeros([BLOCK_Q, D], tl.float32)            # its sum of exp(score − m) · v so far
    end = s
    if CAUSAL:  # no key after this tile's last query: the tiles beyond are never read
        end = tl.minimum(s, (tile + 1) * BLOCK_Q)
    for start in range(0, end, BLOCK_K):
        keys = start + tl.arange(0, BLOCK_K)
        k = tl.load(K + base + keys[:, None] * D + cols[None, :], mask=keys[:, None] < s, other=0.0)
        v = tl.load(V + base + keys[:, None] * D + cols[None, :], mask=keys[:, None] < s, other=0.0)
        tl.atomic_add(SEEN + bh * tl.num_programs(0) + tile, 1)
        scores = tl.dot(q, tl.trans(k)) * qk_scale
        ok = keys[None, :] < s                          # a padded key is no key: −inf, not a score of 0
        if CAUSAL:
            ok = ok & (keys[None, :] <= rows[:, None])
        scores = tl.where(ok, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)                       # what the old maximum's terms are worth now
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(O + base + rows[:, None] * D + cols[None, :], acc / l[:, None], mask=rows[:, None] < s)
    tl.store(LSE + bh * s + rows, m + tl.log(l), mask=rows < s)


@triton.jit
def _tile(PTR, base, index, cols, s, D: tl.constexpr):
    """The rows `index` (< s) of a (s, D) matrix at PTR + base; padding rows read as 0."""
    return tl.load(PTR + base + index[:, None] * D + cols[None, :], mask=index[:, None] < s, other=0.0)


@triton.jit
def _query_side(Q, DO, LSE, DELTA, base, bh, rows, cols, s, D: tl.constexpr):
    """A query tile's q and dO, and its rows' saved log-sum-exp and Δ = Σ_d dO·O (what the backward reads)."""
    q, do = _tile(Q, base, rows, cols, s, D), _tile(DO, base, rows, cols, s, D)
    lse = tl.load(LSE + bh * s + rows, mask=rows < s, other=0.0)
    delta = tl.load(DELTA + bh * s + rows, mask=rows < s, other=0.0)
    return q, do, lse, delta


@triton.jit
def _recompute(q, k, v, do, lse, delta, rows, keys, s, qk_scale, CAUSAL: tl.constexpr):
    """A pair of tiles' probabilities P, rebuilt from the saved log-sum-exp, and dS = P ∘ (dO·Vᵀ − Δ)."""
    ok = (rows[:, None] < s) & (keys[None, :] < s)
    if CAUSAL:
        ok = ok & (keys[None, :] <= rows[:, None])
    p = tl.exp(tl.where(ok, tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None], float("-inf")))
    return p, p * (tl.dot(do, tl.trans(v)) - delta[:, None])


@triton.jit
def _backward_kv(Q, K, V, DO, LSE, DELTA, DK, DV, s, qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr,
                 BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: a key tile's dK and dV, over every query tile that sees it."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    keys = tile * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.arange(0, D)
    base = bh * s * D
    k, v = _tile(K, base, keys, cols, s, D), _tile(V, base, keys, cols, s, D)
    dk = tl.zeros([BLOCK_K, D], tl.float32)
    dv = tl.zeros([BLOCK_K, D], tl.float32)
    first = 0
    if CAUSAL:  # query tiles before this key tile's first key cannot see it
        first = (tile * BLOCK_K // BLOCK_Q) * BLOCK_Q
    for start in range(first, s, BLOCK_Q):
        rows = start + tl.arange(0, BLOCK_Q)
        q, do, lse, delta = _query_side(Q, DO, LSE, DELTA, base, bh, rows, cols, s, D)
        p, ds = _recompute(q, k, v, do, lse, delta, rows, keys, s, qk_scale, CAUSAL)
        dv += tl.dot(tl.trans(p), do)
        dk += tl.dot(tl.trans(ds), q) * qk_scale
    tl.store(DK + base + keys[:, None] * D + cols[None, :], dk, mask=keys[:, None] < s)
    tl.store(DV + base + keys[:, None] * D + cols[None, :], dv, mask=keys[:, None] < s)


@triton.jit
def _backward_q(Q, K, V, DO, LSE, DELTA, DQ, s, qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: a query tile's dQ, over every key tile it sees."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)
    cols = tl.arange(0, D)
    base = bh * s * D
    q, do, lse, delta = _query_side(Q, DO, LSE, DELTA, base, bh, rows, cols, s, D)
    dq = tl.zeros([BLOCK_Q, D], tl.float32)
    end = s
    if CAUSAL:
        end = tl.minimum(s, (tile + 1) * BLOCK_Q)
    for start in range(0, end, BLOCK_K):
        keys = start + tl.arange(0, BLOCK_K)
        k, v = _tile(K, base, keys, cols, s, D), _tile(V, base, keys, cols, s, D)
        _, ds = _recompute(q, k, v, do, lse, delta, rows, keys, s, qk_scale, CAUSAL)
        dq += tl.dot(ds, k) * qk_scale
    tl.store(DQ + base + rows[:, None] * D + cols[None, :], dq, mask=rows[:, None] < s)


@dataclass(frozen=True)
class Flash:
    """What one forward returned: the output, each query's log-sum-exp, and the key tiles each program read."""
    o: torch.Tensor        # (B, H, s, D)
    lse: torch.Tensor      # (B, H, s): log Σ_j exp(q·k_j / √D) over the keys the query sees, natural log
    seen: torch.Tensor     # (B·H, ⌈s / BLOCK_Q⌉) int32: key tiles read by each program (counted in the kernel)

    @property
    def key_tiles_read(self) -> int:
        return int(self.seen.sum())


def check_blocks(block_q: int, block_k: int) -> None:
    for name, b in (("BLOCK_Q", block_q), ("BLOCK_K", block_k)):
        if b not in BLOCKS:
            raise ValueError(f"{name} must be one of {BLOCKS} (a power of two, at least 16 for tl.dot), got {b!r}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k and v must each be (B, H, s, D) and alike, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    d = q.shape[-1]
    if d < 16 or d & (d - 1):
        raise ValueError(f"the head dimension D must be a power of two ≥ 16 (tl.arange and tl.dot need it), got {d}")
    if q.dtype != torch.float32:
        raise ValueError(f"q, k and v must be float32 here, got {q.dtype}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    B, H, s, D = t.shape
    return t.reshape(B * H, s, D).contiguous()


def flash_forward(q, k, v, *, causal: bool = True, block_q: int = 16, block_k: int = 16,
                  kernel: Callable | None = None) -> Flash:
    """Run a forward kernel (the lab's, or one with the same arguments) over the grid (query tiles, B·H)."""
    check_blocks(block_q, block_k)
    check_qkv(q, k, v)
    kernel = kernel or flash_forward_kernel
    B, H, s, D = q.shape
    o = torch.empty(B * H, s, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B * H, s, dtype=torch.float32, device=q.device)
    tiles = triton.cdiv(s, block_q)
    seen = torch.zeros(B * H, tiles, dtype=torch.int32, device=q.device)
    kernel[(tiles, B * H)](_flat(q), _flat(k), _flat(v), o, lse, seen, s, D ** -0.5, D=D, BLOCK_Q=block_q,
                           BLOCK_K=block_k, CAUSAL=causal)
    return Flash(o.view(B, H, s, D), lse.view(B, H, s), seen)


def flash_backward(q, k, v, o, lse, do, *, causal: bool = True, block_q: int = 16, block_k: int = 16):
    """dq, dk, dv of attention from the saved output and log-sum-exp (FlashAttention-2's backward, two kernels)."""
    B, H, s, D = q.shape
    qf, kf, vf, dof = _flat(q), _flat(k), _flat(v), _flat(do)
    lsef = lse.reshape(B * H, s).contiguous()
    delta = (dof * _flat(o)).sum(-1).contiguous()  # Σ_d dO·O per query: the softmax's backward needs it
    dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
    args = dict(D=D, BLOCK_Q=block_q, BLOCK_K=block_k, CAUSAL=causal)
    _backward_kv[(triton.cdiv(s, block_k), B * H)](qf, kf, vf, dof, lsef, delta, dk, dv, s, D ** -0.5, **args)
    _backward_q[(triton.cdiv(s, block_q), B * H)](qf, kf, vf, dof, lsef, delta, dq, s, D ** -0.5, **args)
    return tuple(t.view(B, H, s, D) for t in (dq, dk, dv))


class FlashAttention(torch.autograd.Function):
    """Attention whose forward is a Triton kernel (the lab's or the learner's) and whose backward is the lab's. It
    keeps q, k, v, the output and the log-sum-exp for backward: nothing of size s²."""

    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k, kernel):
        f = flash_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k, kernel=kernel)
        ctx.save_for_backward(q, k, v, f.o, f.lse)
        ctx.settings = (causal, block_q, block_k)
        return f.o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, block_q, block_k = ctx.settings
        dq, dk, dv = flash_backward(q, k, v, o, lse, do.contiguous(), causal=causal, block_q=block_q,
                                    block_k=block_k)
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, *, causal: bool = True, block_q: int = 16, block_k: int = 16,
                    kernel: Callable | None = None) -> torch.Tensor:
    """Attention as scaled_dot_product_attention(q, k, v, is_causal=causal) computes it, through the kernels."""
    return FlashAttention.apply(q, k, v, causal, block_q, block_k, kernel)


def written_out(q, k, v, *, causal: bool = True) -> torch.Tensor:
    """Attention as three separate operations, each writing its result to memory: the s × s scores, the s × s
    probabilities, then the output (what a fused kernel avoids)."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return scores.softmax(-1) @ v


def reference_lse(q, k, *, causal: bool = True) -> torch.Tensor:
    """Each query's log-sum-exp of its scaled scores, written out: what the kernel's LSE must equal."""
    s = q.shape[-2]
    scores = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return scores.logsumexp(-1).float()


def tiles_read(s: int, block_q: int, block_k: int, causal: bool) -> int:
    """Key tiles one batch × head's programs read, computed from the loop bounds: every key tile for each query
    tile, or under the causal mask only those starting at or before the tile's last query."""
    total = 0
    for t in range(triton.cdiv(s, block_q)):
        end = min(s, (t + 1) * block_q) if causal else s
        total += triton.cdiv(end, block_k)
    return total


@dataclass(frozen=True)
class Traffic:
    """Bytes an attention forward reads from and writes to memory for one batch × head (computed)."""
    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


def flash_traffic(s: int, d: int, block_q: int, block_k: int, causal: bool = True, itemsize: int = 4,
                  tiles: int | None = None) -> Traffic:
    """The fused kernel: Q read once, a K and a V tile per key tile read (`tiles`, or as the loop bounds give),
    the output and the log-sum-exp written once."""
    tiles = tiles_read(s, block_q, block_k, causal) if tiles is None else tiles
    return Traffic(read=itemsize * (s * d + 2 * tiles * block_k * d), written=itemsize * (s * d + s))


def written_out_traffic(s: int, d: int, itemsize: int = 4) -> Traffic:
    """Three operations: scores = QKᵀ (reads Q, K; writes s²), softmax (reads and writes s²), P·V (reads s² and V;
    writes the output)."""
    return Traffic(read=itemsize * (2 * s * d + s * s + s * s + s * d), written=itemsize * (s * s + s * s + s * d))
