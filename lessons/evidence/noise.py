"""Lesson 18, section 1: how much do runs differ when nothing changes? The same recipe over seeds: each seed setting
both the initial weights and the order of the data, only the weights, only the data; and one run made twice."""

import statistics
from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most, is_true
from lessons.evidence import Settings
from lessons.evidence.runs import final_loss, over_seeds, recipes


@dataclass(frozen=True)
class Noise:
    """Recipe A's final validation loss over seeds, three ways, and one run repeated."""
    both: list[float]     # the seed sets the initial weights and the order of the data
    weights: list[float]  # the seed sets the weights; the data's order is seed 0's
    order: list[float]    # the seed sets the data's order; the weights are seed 0's
    repeat: float         # |seed 0's run made again − the first|

    def spread(self, which: str) -> float:
        return statistics.stdev(getattr(self, which))


LABELS = {"both": "weights and data order", "weights": "initial weights only", "order": "data order only"}


def run(S: Settings) -> Noise:
    A = recipes(S)["A"]
    both = over_seeds(S, A, desc="seeds: weights and data")
    weights = over_seeds(S, A, data_seed=0, desc="seeds: weights only")
    order = over_seeds(S, A, init=0, desc="seeds: data only")
    again = final_loss.__wrapped__(S, A, 0, 0)  # a fresh run, not the kept one
    return Noise(both, weights, order, abs(again - both[0]))


def figure(n: Noise) -> go.Figure:
    fig = go.Figure()
    for i, (key, label) in enumerate(LABELS.items()):
        values = getattr(n, key)
        fig.add_trace(go.Scatter(x=values, y=[label] * len(values), mode="markers", name=label,
                                 marker=dict(size=10, color=plots.color(i), opacity=0.7),
                                 hovertemplate="%{x:.4f} nats<extra></extra>"))
    fig.update_xaxes(title_text="final validation loss (nats)")
    return plots.style(fig, "The same recipe, only the seed changed: each dot is one run", height=300, legend="right")


def findings(ledger: Ledger, S: Settings, n: Noise) -> Findings:
    sd = n.spread("both")
    ledger.add("repeat_exact", "A run made again with the same seed gives the same loss, to the last bit, on this "
               "machine (|difference|, measured)", n.repeat, at_most(0.0), kind="measured")
    ledger.add("seed_noise", f"Changing only the seed moves the final loss: its standard deviation over {S.seeds} "
               "seeds (nats, measured)", sd, at_least(1e-5), kind="measured")
    ledger.add("both_sources", "Both the initial weights and the order of the data move it, each alone (measured)",
               n.spread("weights") > 1e-5 and n.spread("order") > 1e-5, is_true(), kind="measured", detail=True)
    return Findings([
        f"By about **{sd:.3f}** nats, from the seed alone: the initial weights and the order of the data each move "
        "the loss. That spread is the ruler every comparison below is measured against.",
        "A run made again with the same seed is the same run, to the last bit, on this machine.",
    ], ["| seeds set | standard deviation of the final loss (nats) | lowest | highest |\n|---|---|---|---|\n"
        + "\n".join(f"| {label} | {n.spread(key):.4f} | {min(getattr(n, key)):.4f} | {max(getattr(n, key)):.4f} |"
                    for key, label in LABELS.items()),
        "On a GPU a repeat may differ slightly: some kernels add in an order that varies from run to run."])
