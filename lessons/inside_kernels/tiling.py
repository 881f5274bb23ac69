"""Lesson 22, section 2: what tiling buys. The bytes attention moves to and from memory, the fused kernel's counted
from the key tiles its programs read, the written-out one's from its three operations; the memory each keeps for the
backward, measured from the tensors autograd saved; on a GPU (compiled, not interpreted), the kernel timed."""

from dataclasses import dataclass

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch

from labtools import kernels, plots
from labtools.claims import Findings, Ledger, at_least, between, is_true
from labtools.memory import saved_activations
from labtools.progress import progress
from labtools.widgets import Panel
from lessons.inside_kernels import Settings
from lessons.inside_kernels.flash_exercise import usable


@dataclass(frozen=True)
class Length:
    s: int
    tiles_counted: int          # key tiles the causal kernel's programs read (counted in the kernel)
    tiles_full: int             # the same kernel without the causal mask (counted)
    flash: kernels.Traffic      # bytes the fused kernel moved, from the counted tiles
    written_out: kernels.Traffic
    kept_flash: int             # bytes autograd saved for the backward beyond q, k, v (measured)
    kept_written_out: int


@dataclass(frozen=True)
class Tiling:
    lengths: list[Length]
    block_q: int
    block_k: int
    head_dim: int
    tiles_as_computed: bool     # every count equals the loop bounds' formula
    times: dict | None = None   # on a GPU: milliseconds of one forward, the kernel against PyTorch's (timings)

    def exponent(self, field: str) -> float:
        """The slope of log(bytes kept) against log(s): 1 for memory that grows as s, 2 as s²."""
        x = np.log([r.s for r in self.lengths])
        y = np.log([getattr(r, field) for r in self.lengths])
        return float(np.polyfit(x, y, 1)[0])


def _kept(fn, q, k, v) -> int:
    saved, _ = saved_activations(fn, exclude=[q, k, v])
    return sum(t.nbytes for t in saved)


def run(S: Settings, kernel=None) -> Tiling:
    """kernel: the learner's forward kernel (used if it passes its check), or None for the lab's."""
    return measure(S, usable(kernel) if kernel is not None else None)


def measure(S: Settings, kernel=None) -> Tiling:
    """The counts and memory of `kernel` as it is (None: the lab's), checked or not (a test's planted one)."""
    rows, exact = [], True
    for s in progress(S.lengths, desc="attention at each length"):
        g = torch.Generator().manual_seed(S.seed)
        q, k, v = (torch.randn(1, 1, s, S.head_dim, generator=g).to(kernels.device()).requires_grad_()
                   for _ in range(3))
        with torch.no_grad():
            causal = kernels.flash_forward(q, k, v, causal=True, block_q=S.block_q, block_k=S.block_k, kernel=kernel)
            full = kernels.flash_forward(q, k, v, causal=False, block_q=S.block_q, block_k=S.block_k, kernel=kernel)
        exact &= causal.key_tiles_read == kernels.tiles_read(s, S.block_q, S.block_k, True)
        exact &= full.key_tiles_read == kernels.tiles_read(s, S.block_q, S.block_k, False)
        rows.append(Length(
            s, causal.key_tiles_read, full.key_tiles_read,
            kernels.flash_traffic(s, S.head_dim, S.block_q, S.block_k, tiles=causal.key_tiles_read),
            kernels.written_out_traffic(s, S.head_dim),
            _kept(lambda: kernels.flash_attention(q, k, v, block_q=S.block_q, block_k=S.block_k, kernel=kernel),
                  q, k, v),
            _kept(lambda: kernels.written_out(q, k, v), q, k, v)))
    return Tiling(rows, S.block_q, S.block_k, S.head_dim, bool(exact), timings(S))


def figure(t: Tiling) -> go.Figure:
    s = [r.s for r in t.lengths]
    fig = plots.subplots(1, 2, ["bytes moved by one forward", "bytes kept for the backward"],
                         title="The fused kernel moves several times fewer bytes (both still grow as s²), and keeps "
                               "bytes that grow only as s")
    for col, (flash, written) in enumerate([([r.flash.total for r in t.lengths],
                                             [r.written_out.total for r in t.lengths]),
                                            ([r.kept_flash for r in t.lengths],
                                             [r.kept_written_out for r in t.lengths])], start=1):
        fig.add_trace(go.Scatter(x=s, y=written, name="written out", mode="lines+markers",
                                 line=dict(color=plots.color(1)), showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Scatter(x=s, y=flash, name=f"fused kernel, tiles {t.block_q} × {t.block_k}",
                                 mode="lines+markers", line=dict(color=plots.color(0)), showlegend=col == 1),
                      row=1, col=col)
        fig.update_xaxes(type="log", title_text="sequence length s", row=1, col=col)
        fig.update_yaxes(type="log", title_text="bytes", row=1, col=col)
    return fig


def traffic_figure(head_dim: int, lengths, block_q: int, block_k: int) -> go.Figure:
    """Bytes a causal forward moves for one batch × head against s (computed from the loop bounds)."""
    s = [2 ** i for i in range(6, 15)] if not lengths else sorted(set(lengths) | {2 ** i for i in range(6, 15)})
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=s, y=[kernels.written_out_traffic(n, head_dim).total for n in s], name="written out",
                             mode="lines", line=dict(color=plots.color(1))))
    for i, (bq, bk) in enumerate([(16, 16), (block_q, block_k)]):
        fig.add_trace(go.Scatter(x=s, y=[kernels.flash_traffic(n, head_dim, bq, bk).total for n in s],
                                 name=f"fused, tiles {bq} × {bk}" + (" (chosen)" if i else ""),
                                 mode="lines", line=dict(color=plots.color(0 if i else 2), dash=None if i else "dot")))
    n = s[-1]
    ratio = kernels.written_out_traffic(n, head_dim).total / kernels.flash_traffic(n, head_dim, block_q, block_k).total
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return plots.style(fig, f"Larger query tiles re-read K and V fewer times: at s = {n:,}, the chosen tiles move "
                            f"{ratio:.0f}× fewer bytes than the written-out attention", "sequence length s",
                       "bytes moved (one head, computed)",
                       height=380)


def panel(S: Settings) -> Panel:
    options = list(kernels.BLOCKS)
    return Panel(lambda block_q, block_k: traffic_figure(S.head_dim, S.lengths, block_q, block_k),
                 {"block_q": W.Dropdown(options=options, value=64, description="query tile"),
                  "block_k": W.Dropdown(options=options, value=S.block_k, description="key tile")},
                 debounce_ms=0, title="Tile sizes: how many bytes does a forward move?")


def timings(S: Settings) -> dict | None:
    """On a GPU (compiled kernels): milliseconds of one causal forward at the longest length, B 4 × H 8 × D 64, for
    the Triton kernel, PyTorch's fused attention and the written-out one under torch.compile. None without CUDA."""
    if not torch.cuda.is_available() or kernels.interpreted():
        return None
    q, k, v = (torch.randn(4, 8, max(S.lengths), 64, device="cuda") for _ in range(3))
    written = torch.compile(kernels.written_out)
    fns = {"the lab's Triton kernel": lambda: kernels.flash_forward(q, k, v, block_q=64, block_k=64),
           "PyTorch's fused attention": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                                 is_causal=True),
           "written out, compiled": lambda: written(q, k, v)}
    out = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        out[name] = start.elapsed_time(end) / 20
    return out


def findings(ledger: Ledger, t: Tiling) -> Findings:
    last = t.lengths[-1]
    half = last.tiles_counted / last.tiles_full
    fewer = last.written_out.total / last.flash.total
    e_flash, e_written = t.exponent("kept_flash"), t.exponent("kept_written_out")
    ledger.add("tiles_as_bounds", "the kernel reads exactly the key tiles its loop bounds give, at every length "
               "(counted in the kernel)", t.tiles_as_computed, is_true(), kind="counted")
    ledger.add("causal_half", f"under the causal mask it reads little more than half the key tiles (share at s = "
               f"{last.s})", half, between(0.5, 0.65), kind="counted")
    ledger.add("fewer_bytes", f"at s = {last.s} the fused kernel moves several times fewer bytes than the written-out "
               "attention (ratio)", fewer, at_least(3), kind="counted")
    ledger.add("kept_linear", "the memory the fused kernel keeps for the backward grows as s (exponent of s)",
               e_flash, between(0.9, 1.1), kind="measured")
    ledger.add("kept_quadratic", "the memory the written-out attention keeps for the backward grows as s² (exponent of "
               "s)", e_written,
               between(1.8, 2.1), kind="measured", detail=True)
    rows = "".join(f"| {r.s} | {r.tiles_counted} of {r.tiles_full} | {r.flash.total / 1e3:,.0f} | "
                   f"{r.written_out.total / 1e3:,.0f} | {r.kept_flash / 1e3:,.1f} | {r.kept_written_out / 1e3:,.1f} |\n"
                   for r in t.lengths)
    gpu = []
    if t.times:
        rows = "".join(f"| {name} | {ms:.3f} |\n" for name, ms in t.times.items())
        gpu = [f"| on this GPU, one causal forward (4 sequences × 8 heads, d_h 64) | ms |\n|---|---|\n{rows}"]
    return Findings(
        [f"The causal kernel skipped the key tiles after each query tile: it read about {half:.0%} of them, and moved "
         f"{fewer:.0f}× fewer bytes than the written-out attention at the longest length.",
         "What it keeps for the backward grows as s, as lesson 13 measured for PyTorch's fused kernel; the "
         "written-out attention's grows as s². The probabilities are recomputed, never stored."],
        ["| s | key tiles read (causal of full) | kB moved, fused | kB moved, written out | kB kept, fused | "
         f"kB kept, written out |\n|---|---|---|---|---|---|\n{rows}"
         "\nOne batch × head in fp32. Bytes moved are counted from the tiles the kernel read; bytes kept are "
         "measured from what autograd saved, q, k and v aside.",
         f"The exponent of s fitted to the bytes kept: {e_flash:.2f} fused, {e_written:.2f} written out.", *gpu])
