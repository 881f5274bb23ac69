"""Lesson 00, real training: the synthetic corpus's known floor, then the standard library's text."""

import statistics

import numpy as np
import torch

from labtools import data
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.model import GPT
from labtools.train import History, train
from lessons.training_loop import Settings, build_model, train_config


def synthetic_corpus(S: Settings) -> data.Corpus:
    return data.synthetic(vocab_size=16, order=2, branching=4, seed=S.seed)


def train_run(S: Settings, corpus: data.Corpus, steps: int, desc: str, model: GPT | None = None,
              **model_changes) -> tuple[GPT, History]:
    """Train `model` (default: a fresh one from S) with warmup + cosine to 10% of S.lr."""
    model = model if model is not None else build_model(S, corpus.vocab_size, **model_changes)
    return model, train(model, corpus, train_config(S, steps, desc))


def unigram_entropy(corpus: data.Corpus) -> float:
    """Entropy (nats) of the training split's token frequencies: the loss of a model that ignores context."""
    counts = np.bincount(corpus.train_data.ravel().numpy(), minlength=corpus.vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def sample(model: GPT, corpus: data.Corpus, prompt: str, n: int, seed: int = 0) -> str:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    idx = torch.tensor([corpus.encode(prompt)], device=next(model.parameters()).device)
    out = model.generate(idx, n, temperature=0.8, top_k=20, generator=g)
    return corpus.decode(out[0].tolist())


def floor_findings(ledger: Ledger, S: Settings, corpus: data.Corpus, h: History) -> Findings:
    gap = h.final_val_loss - corpus.entropy_rate
    window = corpus.loss_floor(S.block_size)
    tokens_per_s = statistics.median(h.tokens_per_s)
    ledger.add("floor_gap", f"After {S.steps} steps, val loss is within {S.floor_gap_max} nats of the entropy rate "
               f"{corpus.entropy_rate:.4f}", gap, at_most(S.floor_gap_max), kind="measured")
    ledger.add("above_floor", f"No model beats the {S.block_size}-token window floor {window:.4f} "
               "(val loss − floor ≥ −0.02, the val estimate's sampling error)", h.final_val_loss - window,
               at_least(-0.02), kind="measured")
    ledger.note("floor_gap_nats", gap)
    ledger.note("window_floor_gap_nats", h.final_val_loss - window)
    ledger.note("synthetic_seconds", h.seconds)
    ledger.note("tokens_per_s_median", tokens_per_s)
    return Findings([
        f"After {S.steps} steps ({h.seconds:.0f} s, {tokens_per_s:,.0f} tokens/s): validation loss "
        f"**{h.final_val_loss:.4f}** nats/token, **{gap:.3f}** above the entropy rate {corpus.entropy_rate:.4f}.",
        f"That is {h.final_val_loss - window:.3f} above the floor for {S.block_size}-token windows ({window:.4f}).",
    ])


def text_findings(ledger: Ledger, h1: float, h: History) -> Findings:
    """h1: the corpus's unigram entropy (unigram_entropy), the loss of a model that ignores context."""
    ledger.add("uses_context", f"On text, val loss falls below the unigram entropy {h1:.3f} "
               "(the model uses context, not just character frequencies)", h.final_val_loss, at_most(h1),
               kind="measured")
    ledger.note("text_seconds", h.seconds)
    return Findings([f"Validation loss on text after {len(h.step)} steps: **{h.final_val_loss:.3f}** nats/character, "
                     f"against {h1:.3f} for a model that only knows character frequencies."])
