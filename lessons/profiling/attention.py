"""Lesson 13, section 3: attention written out (the s×s scores materialised) against PyTorch's fused kernel: bytes
saved for backward and time per forward and backward, over sequence lengths s."""

import math
import time

import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, approx, at_least
from labtools.device import pick_device
from labtools.memory import cuda_peak_bytes, saved_activations
from labtools.progress import progress
from lessons.profiling import Settings

WAYS = ("written out", "fused")


def written_out(q, k, v):
    """Causal attention as lesson 00's GPT would write it by hand: scores, mask, softmax, weighted sum."""
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return weights @ v


def fused(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv(S: Settings, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (1, S.attn_heads, T, S.attn_head_dim)
    return [torch.randn(shape, generator=g).to(pick_device()).requires_grad_() for _ in range(3)]


def _seconds(fn, q, k, v) -> float:
    """One forward and backward."""
    sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn(q, k, v).sum().backward()
    sync()
    return time.perf_counter() - t0


def run(S: Settings, rounds: int = 3) -> dict:
    """For each length s: the bytes each way saves for backward beyond q, k and v (what any attention keeps), its
    CUDA peak where there is one, the best time of a forward and backward over alternating rounds, and the outputs'
    agreement; and the kernel PyTorch's fused call dispatched to on this machine."""
    out = {w: {"saved": [], "seconds": [], "peak": []} for w in WAYS}
    out["lengths"], out["max_diff"] = list(S.attn_lengths), 0.0
    fns = {"written out": written_out, "fused": fused}
    for T in progress(S.attn_lengths, desc="attention vs s"):
        q, k, v = _qkv(S, T, S.seed)
        outputs = {}
        for w, fn in fns.items():
            saved, o = saved_activations(lambda: fn(q, k, v), exclude=[q, k, v])
            out[w]["saved"].append(sum(t.nbytes for t in saved))
            outputs[w] = o.detach()
            out[w]["peak"].append(cuda_peak_bytes(lambda: fn(q, k, v).sum().backward()) if q.is_cuda else None)
        out["max_diff"] = max(out["max_diff"], (outputs["written out"] - outputs["fused"]).abs().max().item())
        best = {w: math.inf for w in WAYS}
        for _ in range(rounds):
            for w, fn in fns.items():
                best[w] = min(best[w], _seconds(fn, q, k, v))
        for w in WAYS:
            out[w]["seconds"].append(best[w])
    q, k, v = _qkv(S, S.attn_lengths[0], S.seed)
    names = {op.name for op in profiling.OpTimer.run(lambda: fused(q, k, v), q.device) if op.kind == "attention"}
    out["kernel"] = sorted(names)
    for w in WAYS:
        out[w]["slope"] = float(np.polyfit(np.log(out["lengths"]), np.log(out[w]["saved"]), 1)[0])
    return out


def figure(a: dict) -> go.Figure:
    fig = plots.subplots(1, 2, ["bytes saved for backward, beyond q, k, v", "forward + backward time"],
                         title="Attention written out vs fused, one sequence", height=380)
    for i, w in enumerate(WAYS):
        fig.add_trace(go.Scatter(x=a["lengths"], y=[b / 2**20 for b in a[w]["saved"]], mode="lines+markers",
                                 name=f"{w} (slope {a[w]['slope']:.2f})", line=dict(color=plots.color(i))),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=a["lengths"], y=[s * 1e3 for s in a[w]["seconds"]], mode="lines+markers",
                                 name=w, showlegend=False, line=dict(color=plots.color(i))), row=1, col=2)
    fig.update_xaxes(type="log", title_text="sequence length s", tickvals=a["lengths"])
    fig.update_yaxes(type="log", title_text="MiB", row=1, col=1)
    fig.update_yaxes(type="log", title_text="ms", row=1, col=2)
    return fig


def findings(ledger: Ledger, a: dict, S: Settings) -> Findings:
    T = a["lengths"][-1]
    ratio = a["written out"]["seconds"][-1] / a["fused"]["seconds"][-1]
    saved_ratio = a["written out"]["saved"][-1] / a["fused"]["saved"][-1]
    ledger.add("written_slope", "Written-out attention saves bytes that grow as s² (fitted exponent of the bytes "
               "autograd saved)", a["written out"]["slope"], approx(2.0, abs=0.1), kind="counted")
    ledger.add("fused_slope", "The fused kernel saves bytes that grow as s (fitted exponent)", a["fused"]["slope"],
               approx(1.0, abs=0.1), kind="counted")
    ledger.add("same_output", "Both compute the same attention (largest |difference| of the outputs)",
               a["max_diff"], approx(0.0, abs=1e-4), kind="measured", detail=True)
    ledger.add("fused_less_memory", f"At s = {T} the written-out way saves several times the fused kernel's "
               "bytes (ratio)", saved_ratio, at_least(4), kind="counted")
    ledger.add("fused_faster", f"At s = {T} the fused kernel is faster: written-out ÷ fused time for a forward and "
               "backward (best of alternating rounds)", ratio, at_least(1.5), kind="measured")
    return Findings([
        "Written out, attention keeps its s × s weights for backward, so its memory grows as s². The fused kernel "
        "keeps its output and one number per row, so it grows as s, and recomputes the weights in backward.",
        f"At the longest sequence the fused kernel kept **{saved_ratio:.0f}×** fewer bytes, and was also "
        f"**{ratio:.1f}×** faster here.",
    ], [
        f"Written out, the saved bytes grew as s^{a['written out']['slope']:.2f}: the weights, an s × s matrix per "
        "head, and the mask dominate.",
        f"Fused, as s^{a['fused']['slope']:.2f}: its output, one row per position, and a log-sum-exp per row.",
        f"The longest sequence: s = {T}. The fused kernel that ran here: {kernel_words(a['kernel'])}.",
    ])


def kernel_words(names: list[str]) -> str:
    """The fused kernel PyTorch dispatched to, in words (its aten names are internals)."""
    n = " ".join(names)
    where = " for CPUs" if "for_cpu" in n else ""
    if "flash" in n:
        return f"PyTorch's flash-style kernel{where}"
    if "efficient" in n:
        return "PyTorch's memory-efficient kernel"
    if "cudnn" in n:
        return "cuDNN's attention kernel"
    return "none: the call fell back to the written-out math" if not names else "one of PyTorch's fused kernels"
