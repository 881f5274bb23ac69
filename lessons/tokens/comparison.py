"""Lesson 17, section 3: the same GPT trained on characters and on BPE tokens, at equal compute (the same steps,
sequences and tokens per step; only the vocabulary, and with it the embedding and output layer, differs). Loss per
token ranks them one way; bits per byte of the same held-out text, the fair measure, the other."""

import functools
import math
from dataclasses import dataclass, replace

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import evidence, plots, tokenizer
from labtools.claims import Findings, Ledger, above, at_least, at_most
from labtools.config import gpt_config
from labtools.data import Corpus
from labtools.model import GPT
from labtools.tokenizer import BYTES
from labtools.train import History, TrainConfig, train
from lessons.tokens import Settings, texts
from lessons.tokens.vocabulary import embedding_share, shape

EVAL_BATCHES = 20  # validation batches per estimate


@dataclass(frozen=True)
class Trained:
    """One model's run: its history, and what a token of its held-out text is worth in bytes."""
    name: str
    history: History
    vocab: int
    val_tokens: int
    val_bytes: int
    flops_per_token: float

    @property
    def nats_per_token(self) -> float:
        return self.history.final_val_loss

    def bits_per_byte(self, nats: float | None = None) -> float:
        return tokenizer.bits_per_byte(self.nats_per_token if nats is None else nats, self.val_tokens, self.val_bytes)


@functools.lru_cache(maxsize=2)
def char_corpus(text_chars: int) -> Corpus:
    """The text as characters (one byte each: the standard library's source is kept to printable ASCII)."""
    train_text, val = texts(text_chars)
    itos = sorted(set(train_text + val))
    stoi = {c: i for i, c in enumerate(itos)}
    ids = lambda s: torch.tensor([stoi[c] for c in s], dtype=torch.long)[None]  # noqa: E731
    return Corpus(name="characters", train_data=ids(train_text), val_data=ids(val), itos=itos)


def bpe_corpus(S: Settings, merges: list) -> Corpus:
    """The same text as BPE tokens at S.vocab_size (the first vocab − 256 merges)."""
    enc = tokenizer.encoding(merges[:S.vocab_size - BYTES])
    train_text, val = texts(S.text_chars)
    ids = lambda s: torch.tensor(enc.encode(s, disallowed_special=()), dtype=torch.long)[None]  # noqa: E731
    return Corpus(name="BPE", train_data=ids(train_text), val_data=ids(val),
                  itos=[str(i) for i in range(enc.n_vocab)])


def _train(S: Settings, corpus: Corpus, name: str) -> Trained:
    torch.manual_seed(S.seed)
    model = GPT(gpt_config(S, corpus.vocab_size))
    cfg = TrainConfig(steps=S.steps, batch_size=S.batch_size, block_size=S.block_size, lr=S.lr, seed=S.seed,
                      eval_every=max(1, S.steps // 5), eval_batches=EVAL_BATCHES, desc=name)
    h = train(model, corpus, cfg)
    return Trained(name, h, corpus.vocab_size, corpus.val_data.numel(), len(texts(S.text_chars)[1].encode()),
                   shape(S, corpus.vocab_size).flops_per_token())


def run(S: Settings, merges: list) -> dict[str, Trained]:
    """Both models, the same shape, steps, batch and seed; with S.seeds > 1 also both at the seeds after it (keys
    "characters, seed k", "BPE, seed k")."""
    bpe = bpe_corpus(S, merges)
    out = {"characters": _train(S, char_corpus(S.text_chars), "characters"),
           "BPE": _train(S, bpe, f"BPE, {S.vocab_size:,} tokens")}
    for k in range(1, S.seeds):
        other = replace(S, seed=S.seed + k)
        out[f"characters, seed {other.seed}"] = _train(other, char_corpus(S.text_chars),
                                                       f"characters, seed {other.seed}")
        out[f"BPE, seed {other.seed}"] = _train(other, bpe, f"BPE, seed {other.seed}")
    return out


def _pairs(runs: dict[str, Trained]) -> tuple[list[float], list[float]]:
    """Bits per byte, the characters' and BPE's, seed by seed."""
    chars = [r.bits_per_byte() for k, r in runs.items() if k.startswith("characters")]
    bpe = [r.bits_per_byte() for k, r in runs.items() if k.startswith("BPE")]
    return chars, bpe


def figure(runs: dict[str, Trained]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation loss per token (nats)",
                                                        "validation bits per byte of the same text"))
    for i, r in enumerate(v for k, v in runs.items() if "seed" not in k):
        h = r.history
        fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=r.name,
                                 line=dict(color=plots.color(i)), legendgroup=r.name), row=1, col=1)
        fig.add_trace(go.Scatter(x=h.val_step, y=[r.bits_per_byte(v) for v in h.val_loss], mode="lines+markers",
                                 name=r.name, line=dict(color=plots.color(i)), legendgroup=r.name, showlegend=False),
                      row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="nats per token", row=1, col=1)
    fig.update_yaxes(title_text="bits per byte", row=1, col=2)
    return plots.style(fig, "Per token the characters look better; per byte of the same text, BPE is better",
                       height=420)


def findings(ledger: Ledger, S: Settings, runs: dict[str, Trained]) -> Findings:
    c, b = runs["characters"], runs["BPE"]
    flops_ratio = b.flops_per_token / c.flops_per_token
    ledger.add("equal_compute", "The two models cost about the same per step: the BPE model's FLOPs per token ÷ the "
               "character model's (computed; only the output layer grows with the vocabulary)", flops_ratio,
               at_most(1.5), kind="computed", detail=True)
    ledger.add("per_token_chars", "Per token the character model's validation loss is lower (BPE's − the "
               "characters', nats; one seed: a token of BPE carries more text to predict)",
               b.nats_per_token - c.nats_per_token, at_least(0.5), kind="measured")
    gap = c.bits_per_byte() - b.bits_per_byte()
    chars, bpe = _pairs(runs)
    if len(chars) > 1:  # over seeds, paired (lesson 18)
        ledger.add("per_byte_bpe", "Per byte of the same held-out text the BPE model is better in the same "
                   f"steps (the characters' − BPE's bits per byte, paired over {len(chars)} seeds at {S.steps} "
                   "steps)", evidence.paired(chars, bpe), above(0.1), kind="measured")
    else:
        ledger.add("per_byte_bpe", "Per byte of the same held-out text the BPE model is better in the same "
                   f"steps (the characters' − BPE's bits per byte; one seed at {S.steps} steps)", gap,
                   at_least(0.1), kind="measured")
    share = embedding_share(shape(S, S.vocab_size))[0]
    per_token = b.nats_per_token - c.nats_per_token
    return Findings([
        f"Per token the comparison is meaningless: the character model's loss is lower by **{per_token:.1f}** nats, "
        "because each of its tokens is a single, easier character.",
        f"Per byte of the same text BPE wins by **{gap:.2f}** bits in the same steps, its larger output layer "
        f"costing {flops_ratio - 1:.0%} more compute per token: its tokens carry several bytes each, so it reads "
        "more text.",
    ], [f"Bits per byte: characters {c.bits_per_byte():.3f}, BPE {b.bits_per_byte():.3f}, after {S.steps} steps "
        "of one seed.",
        f"Loss per token: characters {c.nats_per_token:.3f} nats, BPE {b.nats_per_token:.3f}.",
        f"The BPE model's FLOPs per token are {flops_ratio:.2f}× the character model's (its larger output layer); "
        "its embedding is "
        f"{share:.0%} of its parameters."])
