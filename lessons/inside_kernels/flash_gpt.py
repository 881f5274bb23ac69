"""Lesson 22, section 3: the kernel inside a GPT. The same model, weights and batches, its attention computed by a
Triton forward (yours once it passes its check, else the lab's) with the lab's Triton backward, against PyTorch's
fused attention: every parameter's gradient on one batch, then a short training run."""

import functools
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import data, kernels, plots
from labtools.claims import Findings, Ledger, at_most
from labtools.config import LabConfig, build_gpt
from labtools.train import History, TrainConfig, train
from lessons.inside_kernels import Settings
from lessons.inside_kernels.flash_exercise import usable


@dataclass(frozen=True)
class FlashGPT:
    whose: str                 # "yours" or "the lab's": which forward kernel ran
    grad_gap: float            # the largest relative difference of any parameter's gradient, one batch
    loss_gap: float            # the largest |training loss difference| over the short run, nats
    flash: History
    pytorch: History
    seconds: float             # the run through the Triton kernels


def config(S: Settings) -> LabConfig:
    return LabConfig(n_layer=S.flash_layers, n_embd=S.flash_embd, n_head=S.flash_heads, block_size=S.flash_len,
                     batch_size=S.flash_batch, steps=S.flash_steps, lr=S.lr, seed=S.seed)


def _model(S: Settings, kernel, corpus):
    model = build_gpt(config(S), corpus.vocab_size, kernels.device())
    if kernel is not False:  # False: PyTorch's attention
        for block in model.transformer.h:
            block.attn.attend = functools.partial(kernels.flash_attention, block_q=S.block_q, block_k=S.block_k,
                                                  kernel=kernel)
    return model


def _grads(model, X, Y) -> dict[str, torch.Tensor]:
    model.zero_grad()
    _, loss = model(X, Y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _train(S: Settings, kernel, corpus, desc: str) -> History:
    return train(_model(S, kernel, corpus), corpus, TrainConfig(steps=S.flash_steps, batch_size=S.flash_batch,
                                                                lr=S.lr, seed=S.seed, eval_every=S.flash_steps,
                                                                eval_batches=1, desc=desc))


def run(S: Settings, kernel=None) -> FlashGPT:
    """kernel: the learner's forward kernel (used if it passes its check), or None for the lab's."""
    kernel = usable(kernel) if kernel is not None else None  # unwritten or wrong: the lab's runs instead
    corpus = data.text()
    X, Y = corpus.batch("train", S.flash_batch, S.flash_len, torch.Generator().manual_seed(S.seed),
                        device=kernels.device())
    theirs, ours = _grads(_model(S, False, corpus), X, Y), _grads(_model(S, kernel, corpus), X, Y)
    grad_gap = max(((ours[n] - g).norm() / g.norm().clamp(min=1e-30)).item() for n, g in theirs.items())
    pytorch = _train(S, False, corpus, "PyTorch's attention")
    t0 = time.perf_counter()
    flash = _train(S, kernel, corpus, "the Triton kernel")
    gap = max(abs(a - b) for a, b in zip(flash.loss, pytorch.loss))
    return FlashGPT("yours" if kernel is not None else "the lab's", grad_gap, gap, flash, pytorch,
                    time.perf_counter() - t0)


def figure(r: FlashGPT) -> go.Figure:
    fig = plots.loss_curves({"PyTorch's fused attention": r.pytorch, f"Triton kernel ({r.whose})": r.flash},
                            title="The GPT trained through the Triton kernel follows PyTorch's attention step for step")
    return fig


def findings(ledger: Ledger, S: Settings, r: FlashGPT) -> Findings:
    ledger.add("grads_match", f"with {r.whose} forward kernel, every parameter's gradient equals PyTorch's attention's "
               "(largest relative difference)", r.grad_gap, at_most(1e-4), kind="measured")
    ledger.add("losses_match", f"a {S.flash_steps}-step run through the kernel has PyTorch's losses (largest "
               "difference, nats)",
               r.loss_gap, at_most(1e-4), kind="measured", detail=True)
    said = {"yours": "Your kernel computed the attention of every step",
            "the lab's": "The lab's kernel computed the attention (yours once it passes its check)"}[r.whose]
    return Findings(
        [f"{said}; the lab's backward recomputed each tile's probabilities from the log-sum-exp. Every gradient "
         "matched PyTorch's to rounding, and so did the training run.",
         "A kernel that is right on values alone is not enough to train: the log-sum-exp it stores is what the "
         "backward rebuilds the probabilities from."],
        [f"Largest relative gradient difference {r.grad_gap:.1e}; largest loss difference over {S.flash_steps} steps "
         f"{r.loss_gap:.1e} nats. The run through the interpreted kernels took {r.seconds:.1f} s."])
