"""Lesson 12, section 1: FLOPs per token — 6P + 12Lsh and two other conventions against FlopCounterMode."""

from contextlib import nullcontext

import plotly.graph_objects as go
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from labtools.compute import Convention, flops_by_convention
from labtools.device import pick_device
from labtools.model import GPT
from lessons.compute_budget import Settings, gpt


def counted_flops(model: GPT, seq: int, batch: int = 2, seed: int = 0, fused: bool = False) -> dict[str, float]:
    """FLOPs per token of one forward and of one forward + backward, counted by FlopCounterMode (matrix products and
    attention; elementwise work, softmax and LayerNorm are not counted — nor by the formulas).

    Attention runs on PyTorch's math backend here, whose batched products the counter sees. fused=True keeps the
    default kernel: FlopCounterMode has FLOP formulas for the CUDA flash/efficient/cuDNN kernels but none for the
    CPU's fused kernel (torch 2.11-2.13), so on a CPU its attention counts as zero."""
    g = torch.Generator().manual_seed(seed)
    X, Y = (torch.randint(model.config.vocab_size, (batch, seq), generator=g).to(pick_device()) for _ in range(2))
    with nullcontext() if fused else sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd:
            model(X, Y)
        with FlopCounterMode(display=False) as both:
            model(X, Y)[1].backward()
    model.zero_grad(set_to_none=True)
    by_op = {str(op): n / (batch * seq) for op, n in both.get_flop_counts()["Global"].items()}
    return {"forward": fwd.get_total_flops() / (batch * seq), "train": both.get_total_flops() / (batch * seq),
            "by_op": by_op}


def flop_counts(S: Settings) -> list[dict]:
    """For every shape: parameters, the three formulas and the counted FLOPs per token."""
    rows = []
    for L, d, h, T in S.shapes:
        model = gpt(L, d, h, T, S.seed)
        rows.append({"shape": (L, d, h, T), "n_params": model.num_params(), "vocab": model.config.vocab_size,
                     "formulas": flops_by_convention(model, T),
                     **counted_flops(model, T, seed=S.seed),
                     "train_fused": counted_flops(model, T, seed=S.seed, fused=True)["train"]})
    return rows


LABELS = {Convention.MATMUL: "the weights that multiply", Convention.ALL_PARAMETERS: "every parameter",
          Convention.NO_TOKEN_EMBEDDING: "all but the token embedding"}


def table(rows: list[dict]) -> go.Figure:
    names = list(rows[0]["formulas"])
    header = ["model (L, h, a, s)", "counted FLOPs per token"] + [f"6P + 12Lsh, P = {LABELS[n]}" for n in names]
    body = [[f"{r['shape']}", f"{r['train']:,.0f}"] + [f"{r['formulas'][n] / r['train'] - 1:+.1%}" for n in names]
            for r in rows]
    return plots.table(header, body, title="Only the weights that multiply activations give the counted FLOPs")


def findings(ledger: Ledger, rows: list[dict]) -> Findings:
    exact = max(abs(r["formulas"][Convention.MATMUL] / r["train"] - 1) for r in rows)
    ledger.add("flops_formula", f"6P + 12Lsh with P = the matrix weights (tied head counted once) equals "
               f"PyTorch's FLOP counter's count of a training step, {len(rows)} shapes (largest relative difference)", exact,
               at_most(1e-9), kind="counted")
    ratio = [r["train"] / r["forward"] for r in rows]
    ledger.add("backward_2x", "Backward costs twice the forward (|train ÷ forward FLOPs − 3|, every shape)",
               max(abs(x - 3) for x in ratio), at_most(1e-9), kind="counted")
    over = [r["formulas"][Convention.ALL_PARAMETERS] / r["train"] - 1 for r in rows]
    under = [r["formulas"][Convention.NO_TOKEN_EMBEDDING] / r["train"] - 1 for r in rows]
    # what each convention adds or drops, from the parameter counts: the gap to the counter must be 6× exactly that
    idle = [r["n_params"] - (r["formulas"][Convention.MATMUL] - 12 * r["shape"][0] * r["shape"][3] * r["shape"][1]) / 6
            for r in rows]  # parameters that do no products: position embedding, biases, LayerNorms
    head = [r["n_params"] - (r["formulas"][Convention.NO_TOKEN_EMBEDDING]
                             - 12 * r["shape"][0] * r["shape"][3] * r["shape"][1]) / 6 for r in rows]  # V·d
    # The two conventions' gaps are 6 × what each adds or drops: algebra of the counts above, noted, not claimed
    ledger.note("picotron_gap_minus_6_idle", max(abs(r["formulas"][Convention.ALL_PARAMETERS] - r["train"] - 6 * i)
                                                 for r, i in zip(rows, idle)))
    ledger.note("torchtitan_gap_minus_6_idle_head", max(abs(r["formulas"][Convention.NO_TOKEN_EMBEDDING] - r["train"]
                                                            - 6 * (i - h)) for r, i, h in zip(rows, idle, head)))
    attention = [12 * r["shape"][0] * r["shape"][3] * r["shape"][1] for r in rows]
    missing = [r["train"] - r["train_fused"] for r in rows]
    on_cpu = pick_device().type == "cpu"  # no FLOP formula for the CPU's fused kernel; CUDA's kernels have one
    expected = 1.0 if on_cpu else 0.0     # the share of attention the counter misses with the default kernel
    ledger.add("fused_attention", "With the default attention kernel the counter sees " + (
        "none of attention on a CPU: it has no FLOP formula for the fused kernel" if on_cpu else
        "all of attention on this GPU: its kernels have FLOP formulas") + f" (worst |FLOPs missing ÷ 12Lsh − "
        f"{expected:g}| over the shapes)", max(abs(m / a - expected) for m, a in zip(missing, attention)),
        at_most(1e-9), kind="counted")
    ledger.note("flops_per_token", [{"shape": r["shape"], "counted": r["train"], "counted_default_kernel":
                                     r["train_fused"], **{n.value: v for n, v in r["formulas"].items()}} for r in rows])
    unseen = all(m == a for m, a in zip(missing, attention))
    emb = 128_256 * 4096  # Llama 3 8B: vocabulary × width, of 8.03B parameters (its published configuration)
    return Findings([
        "Six FLOPs per weight that multiplies an activation, plus attention's own products: $6P + 12Lsh$ matches "
        "the counter exactly once $P$ counts those weights, and backward costs exactly twice the forward.",
        f"The usual conventions for $P$ count other parameters and miss by a few percent: even at billions, Llama 3 "
        f"8B's token embedding is **{emb / 8.03e9:.1%}** of its parameters.",
    ], [
        f"Counting every parameter misses by {fmt_range(over)}: the position embedding, biases and LayerNorms do no "
        "products.",
        f"Dropping the token embedding misses by {fmt_range(under)}: here it *is* the tied output head, which does a "
        "product.",
        ("With attention's default kernel the counter saw none of attention here: it has no FLOP formula for the "
         "CPU's fused kernel, so the counts above use the written-out attention." if unseen else "With attention's "
         "default kernel the counter saw attention too: this device's kernel has a FLOP formula."),
    ])


def fmt_range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:+.1%}" if abs(hi - lo) < 5e-4 else f"{lo:+.1%} to {hi:+.1%}"
