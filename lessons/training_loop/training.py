"""Lesson 00, real training: the synthetic corpus's known floor, then the standard library's text."""

import math
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


def entropy_findings(S: Settings, corpus: data.Corpus) -> Findings:
    """Section 1's answer: the entropy rate, the floor no model beats."""
    return Findings([f"No model can average below **{corpus.entropy_rate:.3f}** nats per token on this source, its "
                     "entropy rate; an untrained model starts near ln V."],
                    [f"The floor for a window of {S.block_size} tokens, whose first positions see less context: "
                     f"{corpus.loss_floor(S.block_size):.4f} nats per token.",
                     f"ln V = {math.log(corpus.vocab_size):.4f}: the loss of a uniform guess over V = "
                     f"{corpus.vocab_size} tokens."])


def unigram_entropy(corpus: data.Corpus) -> float:
    """Entropy (nats) of the training split's token frequencies: the loss of a model that ignores context."""
    counts = np.bincount(corpus.train_data.ravel().numpy(), minlength=corpus.vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def last_token_entropy(corpus: data.Corpus) -> float:
    """Entropy (nats) of the next token given only the one before it, from the training split's pair counts: the loss
    of a model that ignores everything but the last token."""
    rows = corpus.train_data.reshape(-1, corpus.train_data.shape[-1]).numpy()
    V = corpus.vocab_size
    counts = np.bincount((rows[:, :-1] * V + rows[:, 1:]).ravel(), minlength=V * V).reshape(V, V)
    joint = counts / counts.sum()
    cond = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    nz = counts > 0
    return float(-(joint[nz] * np.log(cond[nz])).sum())


def plateau_ratio(h: History, level: float, within: float = 0.1) -> tuple[int, int]:
    """Steps the training loss (a running mean over 4% of the run) spends within `within` nats of `level`, and steps
    it spends in the 2·`within` nats just below: a loss that stalls at `level` piles up steps there, where a steady
    descent spends as many in each band."""
    w = max(1, len(h.loss) // 25)
    smooth = np.convolve(h.loss, np.ones(w) / w, mode="valid")
    at = int(np.sum(np.abs(smooth - level) <= within))
    below = int(np.sum((smooth < level - within) & (smooth >= level - 3 * within)))
    return at, below


def sample(model: GPT, corpus: data.Corpus, prompt: str, n: int, seed: int = 0) -> str:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    idx = torch.tensor([corpus.encode(prompt)], device=next(model.parameters()).device)
    out = model.generate(idx, n, temperature=0.8, top_k=20, generator=g)
    return corpus.decode(out[0].tolist())


def floor_findings(ledger: Ledger, S: Settings, corpus: data.Corpus, h: History) -> Findings:
    gap = h.final_val_loss - corpus.entropy_rate
    window = corpus.loss_floor(S.block_size)
    tokens_per_s = statistics.median(h.tokens_per_s)
    h_last = last_token_entropy(corpus)
    at, below = plateau_ratio(h, h_last)
    ledger.add("floor_gap", f"After {S.steps} steps, val loss is within {S.floor_gap_max} nats of the entropy rate "
               f"{corpus.entropy_rate:.4f}", gap, at_most(S.floor_gap_max), kind="measured")
    ledger.add("above_floor", f"No model beats the {S.block_size}-token window floor {window:.4f} "
               "(val loss − floor ≥ −0.02, the val estimate's sampling error)", h.final_val_loss - window,
               at_least(-0.02), kind="measured")
    ledger.add("plateau", f"Before it falls, the loss stalls at {h_last:.3f}, the best a model that sees only the "
               "last token can do (steps the smoothed training loss spends within 0.1 nats of it ÷ steps in the 0.2 "
               "nats below; a steady descent gives 1)", at / max(1, below), at_least(3), kind="measured")
    ledger.note("floor_gap_nats", gap)
    ledger.note("window_floor_gap_nats", h.final_val_loss - window)
    ledger.note("last_token_entropy", h_last)
    ledger.note("synthetic_seconds", h.seconds)
    ledger.note("tokens_per_s_median", tokens_per_s)
    return Findings([
        f"Close: validation loss ends **{gap:.2f}** nats above the entropy rate, and no lower than the floor for "
        "windows this long.",
        f"On the way it stalls near **{h_last:.2f}**, the best loss using only the last token, before the model "
        "learns to look two tokens back.",
    ], [
        "| | nats/token |\n|---|---|\n"
        f"| validation loss after {S.steps} steps | {h.final_val_loss:.4f} |\n"
        f"| entropy rate | {corpus.entropy_rate:.4f} |\n"
        f"| floor for {S.block_size}-token windows | {window:.4f} |\n"
        f"| the best using only the last token | {h_last:.4f} |",
        f"The smoothed training loss spent {at} steps within 0.1 nats of that plateau, {at / max(1, below):.0f}× as "
        "many as in the band just below it.",
        f"Training took {h.seconds:.0f} s, at {tokens_per_s:,.0f} tokens/s (median).",
    ])


def text_findings(ledger: Ledger, h1: float, h: History) -> Findings:
    """h1: the corpus's unigram entropy (unigram_entropy), the loss of a model that ignores context."""
    ledger.add("uses_context", f"On text, val loss falls below the unigram entropy {h1:.3f} "
               "(the model uses context, not just character frequencies)", h.final_val_loss, at_most(h1),
               kind="measured")
    ledger.note("text_seconds", h.seconds)
    return Findings([f"Yes: validation loss ends **{h1 - h.final_val_loss:.2f}** nats per character below what a "
                     "model that only knows character frequencies can reach."],
                    [f"After {len(h.step)} steps: {h.final_val_loss:.3f} nats/character, against a unigram entropy "
                     f"of {h1:.3f}.",
                     f"Training took {h.seconds:.0f} s."])
