"""Lesson 17, section 2: what the vocabulary size changes. Bytes per token of held-out text at each size (counted
from the merges: a smaller vocabulary is the first merges of a larger one), and the share of the model's parameters
and FLOPs that the embedding and output layer take (computed, lesson 12's count), here and in GPT-2."""

from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labtools import plots, tokenizer
from labtools.claims import Findings, Ledger, at_least, is_true
from labtools.shapes import MODELS, ModelShape
from labtools.tokenizer import BYTES
from labtools.widgets import Panel
from lessons.tokens import Settings, texts

SAMPLE_CHARS = 160  # held-out characters the panel shows as tokens


@dataclass(frozen=True)
class Size:
    """One vocabulary size: what held-out text costs in tokens there."""
    vocab: int
    tokens: int            # tokens of the validation text
    n_bytes: int
    sample: list[bytes]    # the first SAMPLE_CHARS of it, token by token

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / self.tokens


def run(S: Settings, merges: list) -> list[Size]:
    """Bytes per token of the validation text at every size of the sweep (the first vocab − 256 merges)."""
    _, val = texts(S.text_chars)
    out = []
    for vocab in S.vocab_sweep:
        enc = tokenizer.encoding(merges[:vocab - BYTES])
        out.append(Size(vocab, len(enc.encode(val, disallowed_special=())), len(val.encode()),
                        enc.decode_tokens_bytes(enc.encode(val[:SAMPLE_CHARS], disallowed_special=()))))
    return out


def shape(S: Settings, vocab: int) -> ModelShape:
    return ModelShape(n_layer=S.n_layer, n_embd=S.n_embd, n_head=S.n_head, vocab=vocab, seq=S.block_size)


def embedding_share(m: ModelShape) -> tuple[float, float]:
    """(share of parameters, share of training FLOPs per token) of the token embedding and output layer, tied as
    in the lab's GPT and GPT-2: V·h weights, and the output layer's 6·V·h FLOPs per token (the lookup is free)."""
    return m.vocab * m.n_embd / m.params(), 6 * m.vocab * m.n_embd / m.flops_per_token()


def figure(S: Settings, sizes: list[Size], chosen: int | None = None) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes per token of held-out text (counted)",
                                                        "embedding and output layer's share (computed)"))
    fig.add_trace(go.Scatter(x=[s.vocab for s in sizes], y=[s.bytes_per_token for s in sizes], mode="lines+markers",
                             name="this text", line=dict(color=plots.color(0))), row=1, col=1)
    grid = sorted({*S.vocab_sweep, 2 * max(S.vocab_sweep), 8192, 32768, 50257})
    for i, (label, base) in enumerate((("this lesson's model", shape(S, S.vocab_size)),
                                       ("GPT-2 124M", MODELS["GPT-2 124M"]))):
        shares = [embedding_share(ModelShape(base.n_layer, base.n_embd, base.n_head, v, base.seq)) for v in grid]
        for j, what in enumerate(("parameters", "FLOPs")):
            fig.add_trace(go.Scatter(x=grid, y=[100 * s[j] for s in shares], mode="lines", name=f"{label}: {what}",
                                     line=dict(color=plots.color(i + 1), dash="solid" if j == 0 else "dot")),
                          row=1, col=2)
    if chosen is not None:
        fig.add_vline(x=chosen, line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(type="log", title_text="vocabulary size")
    fig.update_yaxes(title_text="bytes per token", row=1, col=1)
    fig.update_yaxes(title_text="% of the model", row=1, col=2)
    return plots.style(fig, "A larger vocabulary packs more bytes into a token, and takes more of a small model",
                       height=420)


def panel(S: Settings, sizes: list[Size]) -> Panel:
    """A vocabulary size of the sweep → the figure marked there, and held-out text cut at that size."""
    by_size = {s.vocab: s for s in sizes}

    def draw(vocab):
        fig = figure(S, sizes, vocab)
        s = by_size[vocab]
        words = " | ".join(t.decode("utf-8", errors="replace").replace("\n", "↵") for t in s.sample[:24])
        fig.add_annotation(text=f"{vocab:,} tokens: {words[:110]}…", xref="paper", yref="paper", x=0, y=-0.3,
                           showarrow=False, align="left", font=dict(family="monospace", size=11))
        return fig

    controls = {"vocab": W.SelectionSlider(options=list(by_size), value=S.vocab_size if S.vocab_size in by_size
                                           else sizes[-1].vocab, description="vocabulary")}
    return Panel(draw, controls, debounce_ms=0, title="Vocabulary size: bytes per token, and the embedding's share")


def findings(ledger: Ledger, S: Settings, sizes: list[Size]) -> Findings:
    bpt = [s.bytes_per_token for s in sizes]
    grows = all(b2 > b1 for b1, b2 in zip(bpt, bpt[1:]))
    ledger.add("bytes_grow", f"Each larger vocabulary of the sweep ({', '.join(f'{v:,}' for v in S.vocab_sweep)}) "
               "covers more bytes per token of held-out text (counted)", grows, is_true(), kind="counted")
    first, last = sizes[0], sizes[-1]
    ledger.add("fewer_tokens", f"{last.vocab:,} tokens cut the held-out text into fewer than half the tokens of "
               f"{first.vocab} (tokens at {first.vocab} ÷ tokens at {last.vocab}, counted)", first.tokens / last.tokens,
               at_least(2.0), kind="counted")
    params, flops = embedding_share(shape(S, S.vocab_size))
    gpt2 = embedding_share(MODELS["GPT-2 124M"])
    ledger.add("gpt2_embedding", "GPT-2 124M's token embedding (50,257 × 768, tied to its output layer) holds about "
               "a third of its parameters (share, computed from its shape)", gpt2[0], at_least(0.3), kind="computed")
    return Findings([
        f"A larger vocabulary packs more text into each token: the sweep's largest puts **{last.bytes_per_token:.1f}**"
        f" bytes of held-out text in a token, where bytes alone put **{first.bytes_per_token:.1f}**.",
        f"But the vocabulary is paid in parameters: in this small model the embedding is "
        f"**{params:.0%}** of them at {S.vocab_size:,} tokens.",
    ], [f"At {S.vocab_size:,} tokens the output layer computes {flops:.0%} of this model's FLOPs per token.",
        f"GPT-2 124M's embedding is {gpt2[0]:.0%} of its parameters and its output layer {gpt2[1]:.0%} of its "
        "FLOPs.",
        "| vocabulary | bytes per token | tokens of held-out text |\n|---|---|---|\n"
        + "\n".join(f"| {s.vocab:,} | {s.bytes_per_token:.2f} | {s.tokens:,} |" for s in sizes)])
