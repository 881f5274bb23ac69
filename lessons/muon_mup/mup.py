"""Lesson 19, section 3: does the best learning rate carry over from a narrow model to a wide one? The coordinate
check (how large each layer's output grows after a few AdamW steps, by width) and the learning-rate sweep at every
width, under the standard parametrization (SP) and under µP, whose three scalings by width are the difference."""

from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most, between
from labtools.progress import progress
from labtools.train import TrainConfig, train
from lessons.muon_mup import Settings
from lessons.muon_mup.runs import Recipe, corpus, model, optimizer, train_all

PARAMETRIZATIONS = ("SP", "µP")


@dataclass(frozen=True)
class Coordinates:
    """The root mean square of each layer's output on one batch, after S.coord_steps AdamW steps at S.lr."""
    widths: tuple
    rms: dict             # {"SP" | "µP": {"embedding" | "block 1" … | "logits": [one value per width]}}

    @property
    def last_block(self) -> str:
        return [k for k in self.rms["SP"] if k.startswith("block")][-1]

    def growth(self, p: str, layer: str | None = None) -> float:
        """The widest model's value ÷ the narrowest's (the last block's output unless a layer is named)."""
        values = self.rms[p][layer or self.last_block]
        return values[-1] / values[0]


@dataclass(frozen=True)
class Transfer:
    widths: tuple
    lrs: tuple
    finals: dict          # {"SP" | "µP": [[final loss per learning rate] per width]}

    def best(self, p: str) -> list[int]:
        """The index in lrs of the best learning rate, per width."""
        return [min(range(len(self.lrs)), key=row.__getitem__) for row in self.finals[p]]

    def drift(self, p: str) -> int:
        """Grid steps between the best learning rates at the narrowest and at the widest width (positive: lower)."""
        b = self.best(p)
        return b[0] - b[-1]

    def span(self, p: str) -> int:
        """Grid steps between the lowest and the highest best learning rate over every width."""
        b = self.best(p)
        return max(b) - min(b)


def recipe(S: Settings, width: int, lr: float, p: str) -> Recipe:
    # at the base width µP is SP: the same model and the same run
    return Recipe(width, S.steps, lr, mup=p == "µP" and width != S.base_width)


def coordinates(S: Settings) -> Coordinates:
    rms = {p: {} for p in PARAMETRIZATIONS}
    for p, width in progress([(p, w) for p in PARAMETRIZATIONS for w in S.widths], desc="the coordinate check"):
        r = Recipe(width, S.coord_steps, S.lr, mup=p == "µP")
        m = model(S, width, r.mup, 0)
        cfg = TrainConfig(steps=r.steps, batch_size=S.batch_size, block_size=S.block_size, lr=r.lr,
                          eval_every=r.steps, eval_batches=1, progress=False)
        train(m, corpus(), cfg, optimizer=optimizer(m, r))
        for layer, value in activations(S, m).items():
            rms[p].setdefault(layer, []).append(value)
    return Coordinates(tuple(S.widths), rms)


@torch.no_grad()
def activations(S: Settings, m) -> dict[str, float]:
    """RMS of the embedding's output, each block's and the logits on one validation batch."""
    X, _ = corpus().batch("val", S.batch_size, S.block_size, generator=torch.Generator().manual_seed(1),
                          device=next(m.parameters()).device)
    seen = {}
    hooks = [m.transformer.drop.register_forward_hook(lambda mod, i, o: seen.__setitem__("embedding", o))]
    for k, block in enumerate(m.transformer.h):
        hooks.append(block.register_forward_hook(lambda mod, i, o, k=k: seen.__setitem__(f"block {k + 1}", o)))
    logits, _ = m(X)
    for h in hooks:
        h.remove()
    seen["logits"] = logits
    return {k: v.float().pow(2).mean().sqrt().item() for k, v in seen.items()}


def sweep(S: Settings) -> Transfer:
    runs = iter(train_all(S, [recipe(S, w, lr, p) for p in PARAMETRIZATIONS for w in S.widths for lr in S.lrs],
                          "every width at every learning rate, SP and µP"))
    finals = {p: [[next(runs).final for _ in S.lrs] for _ in S.widths] for p in PARAMETRIZATIONS}
    return Transfer(tuple(S.widths), tuple(S.lrs), finals)


def lr_label(lr: float) -> str:
    exponent = torch.log2(torch.tensor(lr)).item()
    return f"2^{exponent:.0f}" if abs(exponent - round(exponent)) < 1e-9 else f"{lr:.3g}"


def coordinates_figure(c: Coordinates) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=PARAMETRIZATIONS, shared_yaxes=True)
    for col, p in enumerate(PARAMETRIZATIONS, start=1):
        for i, (layer, values) in enumerate(c.rms[p].items()):
            fig.add_trace(go.Scatter(x=list(c.widths), y=values, mode="lines+markers", name=layer,
                                     line=dict(color=plots.color(i)), legendgroup=layer, showlegend=col == 1),
                          row=1, col=col)
        fig.update_xaxes(type="log", title_text="width (log scale)", tickvals=list(c.widths), row=1, col=col)
    fig.update_yaxes(type="log", title_text="RMS of the output (log scale)", row=1, col=1)
    return plots.style(fig, "After a few steps, SP's hidden outputs grow with width; under µP every layer's stay "
                       "put", height=400)


def transfer_figure(t: Transfer) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=PARAMETRIZATIONS, shared_yaxes=True, horizontal_spacing=0.08)
    labels, rows = [lr_label(x) for x in t.lrs], [str(w) for w in t.widths]
    values = [v for p in PARAMETRIZATIONS for row in t.finals[p] for v in row]
    lo, hi = min(values), min(max(values), min(values) + 1.0)
    for col, p in enumerate(PARAMETRIZATIONS, start=1):
        fig.add_trace(go.Heatmap(z=t.finals[p], x=labels, y=rows, zmin=lo, zmax=hi, colorscale="Viridis",
                                 reversescale=True, showscale=col == 2,
                                 colorbar=dict(title="final loss"),
                                 hovertemplate="width %{y}, lr %{x}: %{z:.3f}<extra></extra>"), row=1, col=col)
        best = t.best(p)
        fig.add_trace(go.Scatter(x=[labels[b] for b in best], y=rows, mode="markers+lines", showlegend=False,
                                 marker=dict(symbol="star", size=14, color="white", line=dict(color="black", width=1)),
                                 line=dict(color="white", dash="dot"), hoverinfo="skip"), row=1, col=col)
        fig.update_xaxes(title_text="learning rate", row=1, col=col)
    fig.update_yaxes(title_text="width", type="category", row=1, col=1)
    return plots.style(fig, "The best learning rate (stars) moves with width under SP and stays put under µP",
                       height=400)


def findings(ledger: Ledger, S: Settings, c: Coordinates, t: Transfer) -> Findings:
    ledger.add("coord_sp", "after a few steps the last block's output grows with width under SP (widest ÷ "
               "narrowest, RMS)", c.growth("SP"), at_least(2.0), kind="measured")
    ledger.add("coord_mup", "under µP it stays within a factor of two (widest ÷ narrowest, RMS)", c.growth("µP"),
               between(0.5, 2.0), kind="measured")
    ledger.add("sp_drift", "SP's best learning rate falls with width, by two grid steps or more", t.drift("SP"),
               at_least(2), kind="measured")
    ledger.add("mup_stays", "µP's best learning rate stays within one grid step at every width", t.span("µP"),
               at_most(1), kind="measured")
    best_sp, best_mup = t.best("SP"), t.best("µP")
    ratio = S.widths[-1] // S.widths[0]
    edge = " at least" if best_sp[-1] == 0 else ""  # the widest model's best is the smallest rate tried
    mup_values = [max(layer) / min(layer) for layer in c.rms["µP"].values()]
    return Findings(
        [f"Under SP, no: the best learning rate fell{edge} {2 ** t.drift('SP'):.0f}-fold as the model grew "
         f"{ratio}-fold wider. Under µP, yes: the narrowest model's best is within one grid step of every width's.",
         f"The coordinate check shows why: after a few steps at one learning rate, the last block's output was "
         f"{c.growth('SP'):.0f} times as large in SP's widest model as in its narrowest, while under µP every layer's "
         f"output stayed within a factor of {max(mup_values):.1f} across the widths."],
        ["| width | " + " | ".join(str(w) for w in S.widths) + " |\n|---|" + "---|" * len(S.widths)
         + "\n| best lr, SP | " + " | ".join(lr_label(S.lrs[b]) for b in best_sp)
         + " |\n| best lr, µP | " + " | ".join(lr_label(S.lrs[b]) for b in best_mup)
         + " |\n| last block's output, RMS, SP | " + " | ".join(f"{v:.2f}" for v in c.rms["SP"][c.last_block])
         + " |\n| last block's output, RMS, µP | " + " | ".join(f"{v:.2f}" for v in c.rms["µP"][c.last_block])
         + " |"])
