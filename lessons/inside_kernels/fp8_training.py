"""Lesson 22, section 5: a GPT trained with FP8 matmuls. Every linear layer of its blocks multiplies what an FP8
matmul would (inputs, weights and the output's gradient in e4m3), with DeepSeek-V3's fine-grained scales, against the
same layers fed bf16, and against the same formats with no scales; each recipe over the same seeds, paired."""

import dataclasses
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import data, evidence, fp8, plots
from labtools.claims import Findings, Ledger, above, within
from labtools.config import build_gpt
from labtools.device import pick_device
from labtools.evidence import Interval
from labtools.exercises import YourRun, run_yours
from labtools.progress import progress
from labtools.train import History, TrainConfig, train
from lessons.inside_kernels import Settings

COMPARED = ("bf16", "blockwise", "unscaled_e4m3")
NAMES = {"bf16": "bf16", "blockwise": "FP8, fine-grained scales", "unscaled_e4m3": "FP8, no scales"}


@dataclass(frozen=True)
class Training:
    finals: dict                 # {recipe: [final validation loss of each seed]}
    curves: dict                 # {recipe: History of seed 0}
    fp8_vs_bf16: Interval        # fine-grained − bf16, paired by seed
    unscaled_vs_bf16: Interval   # the same formats with no scales − bf16


def gradients(S: Settings) -> torch.Tensor:
    """Every gradient entry of the model's blocks after one batch, at its initial weights (fp32)."""
    corpus = data.text()
    model = build_gpt(S, corpus.vocab_size, pick_device())
    X, Y = corpus.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(S.seed),
                        device=pick_device())
    _, loss = model(X, Y)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.transformer.h.parameters() if p.grad is not None]).cpu()


def train_one(S: Settings, recipe: fp8.Recipe, seed: int, desc: str = "", bar: bool = False) -> History:
    corpus = data.text()
    model = fp8.use_fp8(build_gpt(dataclasses.replace(S, seed=seed), corpus.vocab_size, pick_device()), recipe)
    return train(model, corpus, TrainConfig(steps=S.steps, batch_size=S.batch_size, lr=S.lr, seed=seed,
                                            eval_every=S.steps, eval_batches=8, progress=bar, desc=desc))


def run(S: Settings) -> Training:
    finals, curves = {}, {}
    runs = [(name, seed) for name in COMPARED for seed in range(S.seeds)]
    for name, seed in progress(runs, desc="recipes × seeds"):
        h = train_one(S, fp8.RECIPES[name], seed)
        finals.setdefault(name, []).append(h.final_val_loss)
        curves.setdefault(name, h)
    paired = lambda a: evidence.paired(finals[a], finals["bf16"], S.confidence, over="seeds")  # noqa: E731
    return Training(finals, curves, paired("blockwise"), paired("unscaled_e4m3"))


def figure(t: Training) -> go.Figure:
    fig = plots.loss_curves({NAMES[n]: t.curves[n] for n in COMPARED},
                            title="FP8 with fine-grained scales trains as bf16 does; without scales it falls behind")
    return fig


def with_yours(S: Settings, t: Training, fn) -> YourRun:
    """Seed 0's fine-grained run again, every e4m3 group and square quantised by your function."""
    mine = dataclasses.replace(fp8.RECIPES["blockwise"], quantiser=fn)
    return run_yours(fn, lambda f: train_one(S, mine, 0, "with your quantiser", bar=True), t.curves["blockwise"],
                     what="your quantiser", tol=1e-6)


def findings(ledger: Ledger, S: Settings, t: Training) -> Findings:
    n = len(t.finals["bf16"])
    ledger.add("fp8_as_bf16", f"FP8 with fine-grained scales ends within 0.02 nats of bf16 (final validation loss, FP8 "
               f"− bf16, paired over {n} seeds)", t.fp8_vs_bf16, within(0.02), kind="measured")
    ledger.add("unscaled_behind", "the same FP8 formats with no scales end more than 0.1 nats behind bf16 (no scales "
               "− bf16)", t.unscaled_vs_bf16, above(0.1), kind="measured")
    return Findings(
        ["With a scale per group and square, FP8's matmuls trained the GPT as bf16's did: over these seeds, the "
         "interval for the difference in final loss lies within ±0.02 nats.",
          "Without scales, the gradients lose the entries section 4 saw become 0, and the same run ends "
         f"{t.unscaled_vs_bf16.estimate:.2f} nats behind."],
        [evidence.table([("FP8 fine-grained − bf16", t.fp8_vs_bf16),
                         ("FP8 no scales − bf16", t.unscaled_vs_bf16)],
                        label="final validation loss, nats"),
         f"Each run: {S.steps} steps of a GPT of {S.n_layer} layers of width {S.n_embd}.",
         "The matmuls quantise and dequantise, so here they take as long as fp32's (this CPU has no FP8 units). The "
         "embeddings and the output layer stay in fp32: DeepSeek-V3 kept them in higher precision too."])
