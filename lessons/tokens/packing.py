"""Lesson 17, section 4: documents into rows. The documents are the standard library's function and class
definitions (each with what precedes it up to the previous one), as BPE tokens. Counted: the positions each way of
packing wastes. Measured: a short training run of each, validated on the held-out documents each alone, and the
share of attention that a concatenated row's later documents give its earlier ones (none under the mask)."""

import math
import re
from dataclasses import dataclass

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots, tokenizer
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.config import gpt_config
from labtools.model import GPT
from labtools.packing import IGNORE, Packing, Rows, pack
from labtools.progress import progress
from labtools.tokenizer import BYTES
from labtools.widgets import Panel
from lessons.tokens import Settings, texts

DEFINITION = re.compile(r"(?m)^(?=[ ]*(?:async def|def|class) )")  # a document starts at each definition
VAL_ROWS = 64  # held-out rows each model is validated on
PALETTE = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffff99", "#8dd3c7", "#bebada")
NOISE = 0.075  # nats: runs of lesson 02's size scatter about this much from seed to seed


def documents(text: str) -> list[str]:
    return [d for d in DEFINITION.split(text) if d.strip()]


@dataclass(frozen=True)
class Packed:
    """Each way of packing: its rows and a short training run's validation loss; the attention a concatenated row's
    later documents give its earlier ones."""
    rows: dict[Packing, Rows]
    docs: list[list[int]]                   # the training documents as token ids
    end: int                                # the end-of-text id
    val_loss: dict[Packing, float]          # on held-out documents, each alone (masked rows), nats per token
    crossing: dict[Packing, float]          # attention weight on other documents, where there are some to see
    attention: dict[Packing, list]          # one row's attention weights (heads averaged), T × T, and its documents
    row_docs: list[int]                     # the documents of that row's tokens

    @property
    def doc_tokens(self) -> list[int]:
        return [len(d) + 1 for d in self.docs]


def encoded(S: Settings, merges: list, split: int) -> tuple[list[list[int]], int]:
    """The training (split 0) or held-out (1) documents as token ids, and the end-of-text id."""
    enc = tokenizer.encoding(merges[:S.vocab_size - BYTES])
    docs = [enc.encode(d, disallowed_special=()) for d in documents(texts(S.text_chars)[split])]
    return docs, enc.eot_token


def train_packed(S: Settings, rows: Rows, vocab: int, desc: str) -> GPT:
    """S.pack_steps AdamW steps on batches of random rows."""
    torch.manual_seed(S.seed)
    model = GPT(gpt_config(S, vocab, block_size=S.row_len))
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(S.seed)
    for _ in progress(range(S.pack_steps), desc=desc):
        X, Y, doc = rows.batch(torch.randint(rows.tokens.size(0), (S.batch_size,), generator=g))
        model(X, Y, doc=doc)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


@torch.no_grad()
def attention_weights(model: GPT, X: torch.Tensor, doc: torch.Tensor | None, layer: int = -1) -> torch.Tensor:
    """(B, heads, T, T) the attention weights of one block, computed from its query and key projections as its
    forward does."""
    seen = {}
    block = model.transformer.h[layer]
    hook = block.attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], mask=args[1]
                                                                              if len(args) > 1 else None))
    try:
        model(X, doc=doc)
    finally:
        hook.remove()
    attn, x = block.attn, seen["x"]
    B, T, _ = x.shape
    q, k, _ = attn.c_attn(x).view(B, T, -1, 3, attn.head_size).permute(3, 0, 2, 1, 4).unbind(0)
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_size)
    allowed = seen["mask"] if seen["mask"] is not None else torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def crossing(model: GPT, rows: Rows, masked: bool, n: int = 32) -> float:
    """The share of attention weight queries give to tokens of other documents, over the queries that have any
    earlier document in their row (first n rows)."""
    X, _, _ = rows.batch(torch.arange(min(n, rows.tokens.size(0))))
    doc = rows.doc[:X.size(0), :-1]
    w = attention_weights(model, X, doc if masked else None)       # (B, h, T, T)
    other = (doc[:, :, None] != doc[:, None, :])[:, None]          # (B, 1, T, T): key of another document
    has_other = other.tril().any(-1).expand_as(w[..., 0])          # queries with an earlier document in the row
    return float((w * other).sum(-1)[has_other].mean()) if has_other.any() else 0.0


@torch.no_grad()
def validate(model: GPT, rows: Rows) -> float:
    X, Y, doc = rows.batch(torch.arange(min(VAL_ROWS, rows.tokens.size(0))))
    return float(model(X, Y, doc=doc)[1])


def run(S: Settings, merges: list) -> Packed:
    docs, end = encoded(S, merges, 0)
    val_docs, _ = encoded(S, merges, 1)
    val_rows = pack(val_docs, S.row_len, Packing.MASKED, end)  # each held-out document alone, none wasted
    rows = {how: pack(docs, S.row_len, how, end) for how in Packing}
    shown = _row_with_documents(rows[Packing.CONCAT])
    val, cross, attention = {}, {}, {}
    for how, r in rows.items():
        model = train_packed(S, r, end + 1, how.label)
        val[how] = validate(model, val_rows)
        if how != Packing.PAD:
            masked = how == Packing.MASKED
            cross[how] = crossing(model, r, masked)
            X, _, _ = r.batch(torch.tensor([shown]))
            doc = r.doc[shown:shown + 1, :-1]
            attention[how] = attention_weights(model, X, doc if masked else None)[0].mean(0).tolist()
    return Packed(rows, docs, end, val, cross, attention, rows[Packing.CONCAT].doc[shown, :-1].tolist())


def _row_with_documents(rows: Rows, want: int = 3) -> int:
    """A row that holds several documents (the first with the most, up to `want`), to show attention across them."""
    counts = [len(set(r.tolist())) for r in rows.doc[:, :-1]]
    return next((i for i, c in enumerate(counts) if c >= want), int(np.argmax(counts)))


def rows_figure(rows: Rows, how: Packing, n: int = 12) -> go.Figure:
    """The first n rows: each token coloured by its document, padding grey."""
    d = rows.doc[:n, :-1].numpy().astype(float)
    shown = np.where(d < 0, np.nan, d % len(PALETTE))
    steps = [[k / len(PALETTE), c] for i, c in enumerate(PALETTE) for k in (i, i + 1)]  # one flat band per colour
    fig = go.Figure(go.Heatmap(z=shown, colorscale=steps, zmin=0, zmax=len(PALETTE), showscale=False,
                               hovertemplate="row %{y}, position %{x}<extra></extra>"))
    fig.update_layout(plot_bgcolor="#d0d7de")  # padding (no document) shows as grey
    fig.update_yaxes(autorange="reversed", title_text="row")
    fig.update_xaxes(title_text="position in the row")
    return plots.style(fig, f"{how.label}: {rows.waste:.0%} of the positions train nothing (grey: padding)",
                       height=340)


def figure(p: Packed) -> go.Figure:
    """One concatenated row's attention (the last block, heads averaged), trained without and with the mask; the
    lines mark where a document ends."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("concatenated", "concatenated + document mask"))
    for col, how in enumerate((Packing.CONCAT, Packing.MASKED), start=1):
        w = np.array(p.attention[how])
        fig.add_trace(go.Heatmap(z=np.sqrt(w), colorscale="Blues", showscale=False, customdata=w,
                                 hovertemplate="query %{y}, key %{x}: weight %{customdata:.3f}<extra></extra>"),
                      row=1, col=col)
        edges = [i for i in range(1, len(p.row_docs)) if p.row_docs[i] != p.row_docs[i - 1]]
        for e in edges:
            for kw in (dict(x0=e - 0.5, x1=e - 0.5, y0=-0.5, y1=len(w) - 0.5),
                       dict(y0=e - 0.5, y1=e - 0.5, x0=-0.5, x1=len(w) - 0.5)):
                fig.add_shape(type="line", line=dict(color="#cf222e", width=1), row=1, col=col, **kw)
    fig.update_yaxes(autorange="reversed", title_text="query (position)", col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="key (position)")
    return plots.style(fig, "Attention in one row: without the mask, later documents look back into earlier ones",
                       height=420)


def panel(S: Settings, p: Packed) -> Panel:
    """Packing and row length → the first rows, their documents coloured, and the share wasted (counted at once)."""
    def draw(how, row_len):
        return rows_figure(pack(p.docs, row_len, Packing(how), p.end), Packing(how))

    controls = {"how": W.Dropdown(options=[(h.label, h.value) for h in Packing], value=Packing.PAD.value,
                                  description="packing"),
                "row_len": W.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024],
                                             value=min([16, 32, 64, 128, 256, 512, 1024],
                                                       key=lambda v: abs(v - S.row_len)),
                                             description="row length")}
    return Panel(draw, controls, debounce_ms=0, title="Documents into rows: what each way of packing wastes")


def findings(ledger: Ledger, S: Settings, p: Packed) -> Findings:
    waste = {how: r.waste for how, r in p.rows.items()}
    ledger.add("pad_waste", f"Padding each document to rows of {S.row_len} tokens leaves a share of the positions "
               "training nothing (counted)", waste[Packing.PAD], at_least(0.05), kind="counted")
    ledger.add("concat_waste", "Concatenated, the rows lose only the tokens of the one partial row left at the end "
               "(tokens dropped, counted)", p.rows[Packing.CONCAT].dropped, at_most(S.row_len - 1), kind="counted",
               detail=True)
    ledger.add("concat_crosses", "Concatenated, a row's later documents give part of their attention to its earlier "
               "ones (attention weight on other documents, last block, measured)", p.crossing[Packing.CONCAT],
               at_least(0.05), kind="measured")
    ledger.add("mask_keeps_inside", "Under the document mask no attention crosses a document's edge (the same "
               "measure)", p.crossing[Packing.MASKED], at_most(0.0), kind="measured")
    lengths = np.array(p.doc_tokens)
    best = min(p.val_loss, key=p.val_loss.get)
    spread = max(p.val_loss.values()) - min(p.val_loss.values())
    return Findings([
        f"Concatenated, to waste nothing: padded, each document's last row is partly empty, **{waste[Packing.PAD]:.0%}**"
        f" of the positions at rows of {S.row_len} tokens (more as rows grow longer than documents).",
        f"With the document mask, to keep them apart: unmasked, a row's later documents put "
        f"**{p.crossing[Packing.CONCAT]:.0%}** of their attention on earlier ones they have nothing to do with; "
        "masked, none, and no position is lost.",
        (f"Which trains better this run cannot say: after {S.pack_steps} steps of one seed the three validation "
         f"losses lie within **{spread:.2f}** nats, run-to-run noise (lesson 02)." if spread < NOISE else
         f"This run trained best {best.label}, by **{spread:.2f}** nats over the worst; one seed cannot tell whether "
         "that holds (lesson 02)."),
    ], [f"The documents: {len(lengths):,} definitions, median {np.median(lengths):.0f} tokens, a tenth of them over "
        f"{np.percentile(lengths, 90):.0f}.",
        "| packing | positions wasted | validation loss, nats per token |\n|---|---|---|\n" + "\n".join(
            f"| {how.label} | {waste[how]:.1%} | {p.val_loss[how]:.3f} |" for how in Packing),
        f"Lowest this run: {best.label}, validated on the held-out documents each alone."])
