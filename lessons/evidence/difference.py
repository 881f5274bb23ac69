"""Lesson 18, section 2: is recipe B worse than recipe A? Both over the same seeds: an unpaired interval (Welch's)
and a paired one (the difference seed by seed) from the same runs; and, given yours, your paired interval."""

from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, above, at_least
from labtools.evidence import Interval
from labtools.exercises import Outcome, attempt
from labtools.learner import is_stub
from lessons.evidence import Settings
from lessons.evidence.runs import over_seeds, recipes


@dataclass(frozen=True)
class Comparison:
    """Recipes A and B over the same seeds: final losses, and both intervals of B − A."""
    a: list[float]
    b: list[float]
    paired: Interval
    unpaired: Interval


def run(S: Settings) -> Comparison:
    r = recipes(S)
    a = over_seeds(S, r["A"], desc="recipe A")
    b = over_seeds(S, r["B"], desc="recipe B")
    return Comparison(a, b, evidence.paired(b, a, S.confidence), evidence.unpaired(b, a, S.confidence))


def figure(c: Comparison, yours: Interval | None = None) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55],
                        subplot_titles=("each seed: A, then B", "B − A with its 95% interval"))
    for s, (x, y) in enumerate(zip(c.a, c.b)):
        fig.add_trace(go.Scatter(x=["A", "B"], y=[x, y], mode="lines+markers", line=dict(color=plots.color(s % 10)),
                                 name=f"seed {s}", showlegend=False, hovertemplate="%{y:.4f}<extra></extra>"),
                      row=1, col=1)
    rows = [("unpaired (Welch)", c.unpaired), ("paired by seed", c.paired)]
    if yours is not None:
        rows.append(("yours, paired", yours))
    for i, (label, iv) in enumerate(rows):
        fig.add_trace(go.Scatter(x=[iv.estimate], y=[label], mode="markers", marker=dict(size=10, color=plots.color(i)),
                                 error_x=dict(type="data", symmetric=False, array=[iv.high - iv.estimate],
                                              arrayminus=[iv.estimate - iv.low]), showlegend=False,
                                 hovertemplate=f"{label}: %{{x:.4f}} [{iv.low:.4f}, {iv.high:.4f}]<extra></extra>"),
                      row=1, col=2)
    fig.add_vline(x=0, line=dict(color="black", dash="dash", width=1), row=1, col=2)
    fig.update_yaxes(title_text="final validation loss (nats)", row=1, col=1)
    fig.update_xaxes(title_text="nats", row=1, col=2)
    return plots.style(fig, "The same runs, two intervals: paired by seed, the difference stands clear of zero",
                       height=380)


@dataclass(frozen=True)
class YourInterval:
    """Your paired interval on the lesson's runs, beside the lab's."""
    outcome: Outcome
    interval: Interval | None = None

    def _repr_html_(self) -> str:
        return self.outcome._repr_html_()


def with_yours(fn, S: Settings, c: Comparison) -> YourInterval:
    """Your function's paired interval of B − A on section 2's runs (where your check passed)."""
    if is_stub(fn):
        return YourInterval(Outcome("not written", "not written yet: the answer below uses the lab's interval"))
    tried = attempt(fn, list(c.b), list(c.a), S.confidence, case="this lesson's runs", whose=fn)
    if not tried.returned:
        return YourInterval(tried.outcome)
    try:
        m, lo, hi = (float(v) for v in tried.value)
    except (TypeError, ValueError):
        return YourInterval(Outcome("fail", "return three numbers: (mean difference, low, high)"))
    mine = Interval(m, lo, hi, len(c.a), S.confidence, None, "paired difference")
    if max(abs(m - c.paired.estimate), abs(lo - c.paired.low), abs(hi - c.paired.high)) > 1e-9:
        return YourInterval(Outcome("fail", f"on the lesson's runs yours is [{lo:.4f}, {hi:.4f}], the lab's "
                                            f"[{c.paired.low:.4f}, {c.paired.high:.4f}]: the check above says why"),
                            mine)
    side = "above zero: B is worse" if lo > 0 else "below zero: B is better" if hi < 0 else "around zero: no verdict"
    return YourInterval(Outcome("pass", f"your interval on the lesson's runs, [{lo:.4f}, {hi:.4f}] nats, lies {side}"),
                        mine)


def findings(ledger: Ledger, S: Settings, c: Comparison) -> Findings:
    p, u = c.paired, c.unpaired
    ledger.add("b_worse", f"Recipe B (learning rate {S.lr_b:g} instead of {S.lr:g}) ends worse than A: B − A, paired by "
               f"seed over {S.seeds} seeds (nats)", p, above(0.0), kind="measured")
    ledger.add("paired_narrower", "Paired by seed, the interval is narrower than from the same runs unpaired (the "
               "unpaired half-width ÷ the paired one, measured)", u.half_width / p.half_width, at_least(1.0),
               kind="measured")
    verdict = ("Yes" if p.low > 0 else "No: B is better" if p.high < 0 else "This run cannot tell")
    return Findings([
        f"{verdict}: B's loss is higher by **{p.estimate:.4f}** nats on average, and paired by seed the interval "
        f"{'lies wholly above zero' if p.low > 0 else 'reaches zero'}.",
        f"Unpaired, the same runs give an interval **{u.half_width / p.half_width:.1f}×** as wide: pairing cancels "
        "the luck the two recipes share, each seed's own weights and data.",
    ], [evidence.table([("B − A, paired by seed", p), ("B − A, unpaired (Welch)", u)]),
        f"Every interval here is {S.confidence:.0%}."])
