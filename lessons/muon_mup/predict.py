"""Lesson 19, section 4: can small runs predict a big one? Small µP runs at the learning rate section 3 found at
the narrowest width, each trained for steps proportional to its width, spend a budget of compute; a power law in
compute fitted to their final losses predicts the loss of a run with many times their compute; the prediction is
made (and shown) before that run is; then the run is made and the prediction graded. Yours: your own choice of
small runs within the same budget, fitted the same way, shown beside the lab's."""

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most, in_words
from labtools.widgets import Panel
from lessons.muon_mup import Settings
from lessons.muon_mup.mup import Transfer
from lessons.muon_mup.runs import Recipe, Run, flops, train_all, train_run


@dataclass(frozen=True)
class Law:
    """loss = A · C^(−gamma): a straight line in log loss against log compute, fitted by least squares."""
    a: float
    gamma: float

    def __call__(self, compute: float) -> float:
        return self.a * compute ** -self.gamma


@dataclass(frozen=True)
class Ladder:
    """Small runs that spent at most the budget, and the prediction their law makes for the big run."""
    rungs: tuple           # (width, steps) per small run
    runs: tuple            # Run per rung
    compute: tuple         # training FLOPs per run (6 per parameter per token, counted from the model)
    law: Law
    big_compute: float
    predicted: float       # the law at the big run's compute, nats

    @property
    def spent(self) -> float:
        """The small runs' compute together ÷ the big run's."""
        return sum(self.compute) / self.big_compute


@dataclass(frozen=True)
class Graded:
    ladder: Ladder
    big: Run
    yours: Ladder | None   # your ladder, where it differs from the lab's

    @property
    def error(self) -> float:
        """Predicted − measured, nats (positive: the big run did better than the law said)."""
        return self.ladder.predicted - self.big.final


def transferred_lr(S: Settings, t: Transfer) -> float:
    """µP's best learning rate at the narrowest width: tuned small, used at every width."""
    return S.lrs[t.best("µP")[0]]


def recipe(S: Settings, width: int, lr: float, steps: int | None = None) -> Recipe:
    """A run of section 4: µP at the transferred learning rate, for steps proportional to its width by default."""
    return Recipe(width, S.steps_at(width) if steps is None else steps, lr, mup=width != S.base_width)


def fit(compute, losses) -> Law:
    slope, intercept = np.polyfit(np.log(compute), np.log(losses), 1)
    return Law(float(math.exp(intercept)), float(-slope))


def rungs(S: Settings, ladder=None, name: str = "LADDER") -> tuple[tuple[int, int], ...]:
    """(width, steps) per small run, checked: a width alone trains for steps proportional to it (S.steps_at), a
    (width, steps) pair for those steps. ValueError naming the parameter: fewer than two runs, a width that is not a
    multiple of HEAD_DIM or not narrower than the big run, two runs of the same compute, a ladder that spends more
    than the budget, or a budget too small for any run."""
    ladder = S.ladder if ladder is None else ladder
    out = []
    for entry in ladder if isinstance(ladder, (tuple, list)) else ():
        w, steps = (entry, None) if not isinstance(entry, (tuple, list)) else (tuple(entry) + (None, None))[:2]
        steps = S.steps_at(w) if steps is None and isinstance(w, int) and w > 0 else steps
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (w, steps)) \
                or w % S.head_dim or (isinstance(entry, (tuple, list)) and len(entry) != 2):
            raise ValueError(f"{name}: each small run is a width, or a (width, steps) pair, with the width a multiple "
                             f"of HEAD_DIM={S.head_dim} and steps a whole number ≥ 1; got {entry!r}")
        if w >= S.big_width:
            raise ValueError(f"{name}: every small run must be narrower than the big run ({S.big_width}), got {w}")
        out.append((w, steps))
    big = flops(S, S.big_width, S.steps_at(S.big_width))
    compute = [flops(S, w, steps) for w, steps in out]
    if len(out) < 2 or len(set(compute)) < len(compute):
        raise ValueError(f"{name} must hold two or more small runs of different compute, got {ladder!r}: a law "
                         "needs two points or more")
    smallest = flops(S, S.ladder[0], S.steps_at(S.ladder[0])) / big
    if S.budget < smallest:
        raise ValueError(f"BUDGET ({S.budget:.3g} of the big run's compute) is smaller than one run: the narrowest "
                         f"small run alone spends {smallest:.3g}")
    spent = sum(compute) / big
    if spent > S.budget:
        raise ValueError(f"{name} spends {spent:.1%} of the big run's compute; BUDGET allows {S.budget:.1%}: drop "
                         "a run, or choose narrower or shorter ones")
    return tuple(sorted(out, key=lambda r: flops(S, *r)))


def ladder(S: Settings, t: Transfer, mine=None) -> Ladder:
    """The lab's ladder (S.ladder), or yours (mine: widths or (width, steps) pairs), trained and fitted."""
    these = rungs(S, mine, "LADDER" if mine is None else "MY_LADDER")
    lr = transferred_lr(S, t)
    runs = tuple(train_all(S, [recipe(S, w, lr, steps) for w, steps in these],
                           "the small runs" if mine is None else "your small runs"))
    compute = tuple(flops(S, w, steps) for w, steps in these)
    law = fit(compute, [r.final for r in runs])
    big = flops(S, S.big_width, S.steps_at(S.big_width))
    return Ladder(these, runs, compute, law, big, law(big))


def big_run(S: Settings, t: Transfer) -> Run:
    return train_run(S, recipe(S, S.big_width, transferred_lr(S, t)), desc="the big run")


def figure(g: Graded, k: int | None = None, tolerance: float | None = None) -> go.Figure:
    """The ladder's runs, the law fitted to the first k of them (all: None), its prediction and the big run."""
    L = g.ladder
    k = len(L.runs) if k is None else k
    law = fit(L.compute[:k], [r.final for r in L.runs[:k]])
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(L.compute[:k]), y=[r.final for r in L.runs[:k]], mode="markers",
                             marker=dict(size=10, color=plots.color(0)), name="small runs the law is fitted to",
                             text=[f"width {w}, {steps} steps" for w, steps in L.rungs[:k]],
                             hovertemplate="%{text}: %{y:.3f}<extra></extra>"))
    if k < len(L.runs):
        fig.add_trace(go.Scatter(x=list(L.compute[k:]), y=[r.final for r in L.runs[k:]], mode="markers",
                                 marker=dict(size=10, color=plots.color(0), symbol="circle-open"),
                                 name="small runs left out"))
    xs = np.geomspace(L.compute[0], L.big_compute, 50)
    fig.add_trace(go.Scatter(x=xs, y=[law(x) for x in xs], mode="lines", line=dict(dash="dot", color=plots.color(0)),
                             name="the law"))
    fig.add_trace(go.Scatter(x=[L.big_compute], y=[law(L.big_compute)], mode="markers", name="predicted",
                             marker=dict(size=12, symbol="diamond-open", color=plots.color(1)),
                             error_y=dict(type="constant", value=tolerance or 0, visible=tolerance is not None)))
    fig.add_trace(go.Scatter(x=[L.big_compute], y=[g.big.final], mode="markers", name="the big run",
                             marker=dict(size=12, symbol="diamond", color=plots.color(2))))
    if g.yours is not None:
        Y = g.yours
        fig.add_trace(go.Scatter(x=list(Y.compute), y=[r.final for r in Y.runs], mode="markers",
                                 marker=dict(size=9, color=plots.color(3), symbol="x"), name="your small runs"))
        fig.add_trace(go.Scatter(x=[Y.big_compute], y=[Y.predicted], mode="markers", name="your prediction",
                                 marker=dict(size=12, symbol="diamond-open", color=plots.color(3))))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return plots.style(fig, "The law from the small runs, carried to the big run's compute, and where it landed",
                       "training compute (FLOPs, log scale)", "final validation loss (nats, log scale)", height=420)


def panel(S: Settings, g: Graded) -> Panel:
    from ipywidgets import IntSlider
    n = len(g.ladder.runs)
    return Panel(lambda runs: figure(g, runs, S.tolerance),
                 {"runs": IntSlider(value=n, min=2, max=n, description="small runs fitted")},
                 title="Fewer small runs, a longer reach")


def findings(ledger: Ledger, S: Settings, g: Graded) -> Findings:
    L = g.ladder
    reach = L.big_compute / L.compute[-1]
    ledger.add("reach", "the big run has many times the compute of the largest small run (ratio)", reach,
               at_least(5), kind="counted")
    ledger.add("spent", f"the small runs together spent at most {S.budget:.0%} of the big run's compute (share)",
               L.spent, at_most(S.budget), kind="counted", detail=True)
    ledger.add("predicted", f"the law from the small runs predicts the big run's loss within ±{S.tolerance} nats "
               "(predicted − measured)", abs(g.error), at_most(S.tolerance), kind="measured")
    ledger.note("prediction_error", g.error)
    good = abs(g.error) <= S.tolerance
    said = [f"{'Yes' if good else 'Not this time'}: the law from runs spending {L.spent:.0%} of its compute predicted "
            f"the big run's loss to {abs(g.error):.2f} nats" + ("." if good else f", beyond the ±{S.tolerance} allowed."),
            "It erred " + ("high: the big run ended below the line the small runs drew." if g.error > 0 else
                           "low: the big run ended above the line the small runs drew.")]
    if g.yours is not None:
        mine = g.yours.predicted - g.big.final
        said.append(f"Your ladder missed by {abs(mine):.2f} nats, "
                    + ("nearer than the lab's." if abs(mine) < abs(g.error) else "farther than the lab's."))
    small = [("small", L)] + ([("yours", g.yours)] if g.yours is not None else [])
    return Findings(
        said,
        ["| run | width | steps | compute (FLOPs) | final loss |\n|---|---|---|---|---|\n"
         + "\n".join(f"| {who} | {w} | {steps} | {c:.3g} | {r.final:.3f} |"
                     for who, lad in small for (w, steps), r, c in zip(lad.rungs, lad.runs, lad.compute))
         + f"\n| big | {S.big_width} | {g.big.recipe.steps} | {L.big_compute:.3g} | {g.big.final:.3f} |",
         "| the law, loss = A · C^−γ | |\n|---|---|\n"
         f"| A | {L.law.a:.3g} |\n| γ | {L.law.gamma:.4f} |\n| predicted, nats | {L.predicted:.3f} |\n"
         f"| measured, nats | {g.big.final:.3f} |\n| the big run's compute ÷ the largest small run's | {reach:.0f} |"])


def commitment(S: Settings, L: Ladder, yours: bool = False):
    """The prediction, said before the big run is made."""
    from IPython.display import Markdown
    who = "Your ladder predicts" if yours else "The lab's ladder predicts"
    return Markdown(f"**{who} {L.predicted:.3f} nats** for the big run, from {in_words(len(L.runs))} small runs "
                    f"that spent {L.spent:.0%} of its compute.")
