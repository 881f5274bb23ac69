"""Lesson 18, section 4: "not different" is not "the same". Recipe C (no weight decay) against A over the seeds,
and B against A from two runs each, unpaired: an interval inside ±margin says the same; one that merely reaches zero
says nothing."""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, is_true, within
from labtools.evidence import Interval
from lessons.evidence import Settings
from lessons.evidence.difference import Comparison
from lessons.evidence.runs import over_seeds, recipes


@dataclass(frozen=True)
class Same:
    c_minus_a: Interval    # over every seed
    two_seeds: Interval    # B − A from two runs of each (seeds 0 and 1), unpaired


def run(S: Settings, c: Comparison) -> Same:
    C = over_seeds(S, recipes(S)["C"], desc="recipe C")
    return Same(evidence.paired(C, c.a, S.confidence), evidence.unpaired(c.b[:2], c.a[:2], S.confidence))


def verdict(iv: Interval, margin: float) -> str:
    if -margin <= iv.low and iv.high <= margin:
        return "the same, to the margin"
    if iv.low > 0 or iv.high < 0:
        return "different"
    return "cannot tell"


def figure(s: Same, c: Comparison, S: Settings) -> go.Figure:
    rows = [(f"C − A, {s.c_minus_a.n} seeds", s.c_minus_a), (f"B − A, {s.two_seeds.n} runs each, unpaired",
                                                                 s.two_seeds),
            (f"B − A, {c.paired.n} seeds, paired", c.paired)]
    fig = go.Figure()
    fig.add_vrect(x0=-S.margin, x1=S.margin, fillcolor="#bbf7d0", opacity=0.5, line_width=0)
    for i, (label, iv) in enumerate(rows):
        fig.add_trace(go.Scatter(x=[iv.estimate], y=[f"{label}: {verdict(iv, S.margin)}"], mode="markers",
                                 marker=dict(size=10, color=plots.color(i)), showlegend=False,
                                 error_x=dict(type="data", symmetric=False, array=[iv.high - iv.estimate],
                                              arrayminus=[iv.estimate - iv.low]),
                                 hovertemplate=f"%{{x:.4f}} [{iv.low:.4f}, {iv.high:.4f}]<extra></extra>"))
    fig.add_vline(x=0, line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(title_text="difference in final loss (nats)")
    return plots.style(fig, "Inside the green band: the same; across zero but wider: cannot tell", height=320)


def findings(ledger: Ledger, S: Settings, s: Same) -> Findings:
    ledger.add("c_same", f"Weight decay {S.wd_c:g} or {S.weight_decay:g} makes the same run to ±{S.margin:g} nats: C − A, "
               f"paired over {S.seeds} seeds (nats)", s.c_minus_a, within(S.margin), kind="measured")
    two = s.two_seeds
    ledger.add("two_runs_cannot_tell", f"From two runs of each, unpaired, the B − A interval reaches zero yet is wider "
               f"than ±{S.margin:g}: neither different nor the same (measured)",
               two.low <= 0 <= two.high and two.half_width > S.margin, is_true(), kind="measured")
    real = s.c_minus_a.low > 0 or s.c_minus_a.high < 0
    return Findings([
        f"Weight decay or none: C − A lies inside ±**{S.margin:g}** nats, so here they are the same, to that margin"
        + (", even though the interval misses zero: a real difference can be too small to matter." if real else "."),
        "B against A from two runs each, unpaired: the interval reaches zero but is far wider than the margin. That "
        "is not 'the same'; two runs cannot tell.",
    ], [evidence.table([("C − A, paired by seed", s.c_minus_a), ("B − A, two runs each, unpaired", two)])])
