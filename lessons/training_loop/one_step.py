"""Lesson 00, one step taken apart: the phases of a training step timed, and the loss at initialisation."""

import math
import statistics
import time

import plotly.graph_objects as go
import torch

from labtools import data, plots
from labtools.claims import Findings, Ledger, approx
from labtools.device import pick_device
from labtools.optim import param_groups
from labtools.progress import progress
from lessons.training_loop import Settings, build_model


def time_phases(S: Settings, corpus: data.Corpus) -> dict[str, list[float]]:
    """Wall time (ms) of each phase of a training step, repeated S.timing_repeats times."""
    model = build_model(S, corpus.vocab_size)
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=S.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(S.seed)
    dev = pick_device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in ("batch", "forward", "backward", "clip", "step", "zero_grad")}

    def timed(name, fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times[name].append((time.perf_counter() - t0) * 1e3)
        return out

    for i in progress(range(S.timing_repeats + 2), desc="timing one step"):
        X, Y = timed("batch", lambda: corpus.batch("train", S.batch_size, S.block_size, g, dev))
        _, loss = timed("forward", lambda: model(X, Y))
        timed("backward", loss.backward)
        timed("clip", lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        timed("step", optimizer.step)
        timed("zero_grad", lambda: optimizer.zero_grad(set_to_none=True))
        if i < 2:  # warm-up iterations (allocator, lazy init) are not counted
            for v in times.values():
                v.pop()
    return times


def phase_summary(times: dict[str, list[float]]) -> Findings:
    med = {k: statistics.median(v) for k, v in times.items()}
    f, b = med["forward"], med["backward"]
    share = 100 * (med["step"] + med["clip"]) / sum(med.values())
    ratio = b / f
    why = ("about the two matrix products it does for each one of the forward's" if 1.7 <= ratio <= 2.6 else
           "not the 2× the matrix products predict; at this small size other costs weigh as much (the times are "
           "noisy: rerun the cell)")
    return Findings([f"Backward took **{ratio:.1f}×** the forward: {why}.",
                     f"Clipping and the optimizer step take {share:.0f}% of the step"
                     + (": forward and backward's matrix products take most of it." if b + f > sum(med.values()) / 2
                        else ".")],
                    [f"Median of {len(times['forward'])} repeats: forward {f:.2f} ms, backward {b:.2f} ms.",
                     "| phase | median (ms) |\n|---|---|\n" + "\n".join(f"| {k} | {v:.2f} |" for k, v in med.items())])


def phase_figure(times: dict[str, list[float]]) -> go.Figure:
    names = list(times)
    med = [statistics.median(times[k]) for k in names]
    lo = [m - min(times[k]) for m, k in zip(med, names)]
    hi = [max(times[k]) - m for m, k in zip(med, names)]
    fig = go.Figure(go.Bar(x=names, y=med, marker_color=plots.color(0), texttemplate="%{y:.2f} ms",
                           error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo)))
    ratio = statistics.median(times["backward"]) / statistics.median(times["forward"])
    plots.style(fig, title=f"Backward takes {ratio:.1f}× the forward's time (median, min–max over repeats)",
                      yaxis_title="ms", height=340)
    return fig


def first_step_findings(ledger: Ledger, vocab_size: int, *, init_loss: float, sigma: float,
                        update_ratio: float) -> Findings:
    """The written-out step's numbers (measured in the notebook cell) against what theory predicts."""
    ln_v = math.log(vocab_size)
    predicted = ln_v + sigma**2 / 2
    ledger.add("init_ln_v", f"Loss at initialisation ≈ ln V = ln {vocab_size} (within 5%)", init_loss,
               approx(ln_v, rel=0.05), kind="measured")
    ledger.add("init_sigma", "More precisely, loss at initialisation ≈ ln V + σ²/2, with σ the spread (std) of the "
               "initial logits (within 1%)", init_loss, approx(predicted, rel=0.01), kind="measured")
    ledger.add("adam_first_step", "Adam's first step moves every parameter by ≈ η, so ‖Δθ‖ ≈ η√P (ratio within 5% "
               "of 1)", update_ratio, approx(1.0, abs=0.05), kind="measured")
    return Findings([
        f"Before training, the loss is **{init_loss:.2f}**, close to ln V = {ln_v:.2f}: the untrained model gives "
        "every token about the same probability.",
        f"Adam's first step moved the weights by **{update_ratio:.3f}** × η√P: every parameter by about η, whatever "
        "its gradient.",
    ], [
        f"Loss at initialisation {init_loss:.4f}, against ln V = {ln_v:.4f}.",
        f"More precisely, ln V + σ²/2 = {predicted:.4f}, with σ = {sigma:.4f} the spread of the initial "
        "logits.",
    ])
