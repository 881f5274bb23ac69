"""Lesson 18, section 3: how many seeds does a difference need? Resampled from section 2's runs: draw n seeds' worth
of them, again and again, and count how often the 95% interval of B − A excludes zero (paired, and unpaired); beside
it, the usual formula, n ≈ (z₀.₉₇₅ + z₀.₈)² · σ² / d², for a test that finds the difference 4 times in 5."""

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_least
from labtools.evidence import t_quantile
from lessons.evidence import Settings
from lessons.evidence.difference import Comparison

DRAWS = 2000          # resamples per number of seeds
TARGET = 0.8          # a test that finds the difference 4 times in 5
Z = 1.959963984540054 + 0.8416212335729143  # z at 0.975 plus z at 0.8


@dataclass(frozen=True)
class Power:
    """The share of resamples whose interval excluded zero, per number of seeds, and the formula's seeds."""
    seeds: list[int]
    paired: list[float]
    unpaired: list[float]
    formula_paired: float    # seeds the formula asks for, from the runs' spread and mean difference
    formula_unpaired: float

    def needed(self, which: str) -> int | None:
        """The fewest seeds at which the resamples found the difference TARGET of the time (None: none tried)."""
        return next((n for n, p in zip(self.seeds, getattr(self, which)) if p >= TARGET), None)


def run(S: Settings, c: Comparison, most: int = 24) -> Power:
    a, b = np.array(c.a), np.array(c.b)
    d = b - a
    rng = np.random.default_rng(S.seed)
    seeds = list(range(2, most + 1))
    paired, unpaired = [], []
    for n in seeds:
        q = t_quantile(n - 1, (1 + S.confidence) / 2)
        pick = rng.integers(0, len(d), size=(DRAWS, n))
        dd = d[pick]
        half = q * dd.std(axis=1, ddof=1) / math.sqrt(n)
        paired.append(float(np.mean(np.abs(dd.mean(axis=1)) > half)))
        aa, bb = a[rng.integers(0, len(a), size=(DRAWS, n))], b[rng.integers(0, len(b), size=(DRAWS, n))]
        va, vb = aa.var(axis=1, ddof=1) / n, bb.var(axis=1, ddof=1) / n
        df = (va + vb) ** 2 / np.maximum(va ** 2 / (n - 1) + vb ** 2 / (n - 1), 1e-300)
        from scipy.special import stdtrit
        qw = stdtrit(df, (1 + S.confidence) / 2)
        unpaired.append(float(np.mean(np.abs(bb.mean(axis=1) - aa.mean(axis=1)) > qw * np.sqrt(va + vb))))
    mean = abs(float(d.mean()))
    fp = (Z * float(d.std(ddof=1)) / mean) ** 2 if mean else math.inf
    fu = Z ** 2 * (float(a.var(ddof=1)) + float(b.var(ddof=1))) / mean ** 2 if mean else math.inf
    return Power(seeds, paired, unpaired, fp, fu)


def figure(p: Power) -> go.Figure:
    fig = go.Figure()
    for i, (key, label) in enumerate((("paired", "paired by seed"), ("unpaired", "unpaired"))):
        fig.add_trace(go.Scatter(x=p.seeds, y=[100 * v for v in getattr(p, key)], mode="lines+markers", name=label,
                                 line=dict(color=plots.color(i))))
        n = getattr(p, f"formula_{key}")
        if n <= max(p.seeds):
            fig.add_vline(x=n, line=dict(color=plots.color(i), dash="dot", width=1))
    fig.add_hline(y=100 * TARGET, line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(title_text="seeds per recipe")
    fig.update_yaxes(title_text="% of resamples that find B worse", range=[0, 102])
    return plots.style(fig, "Paired by seed, fewer seeds find the difference (dotted: the formula's count)",
                       height=380)


def findings(ledger: Ledger, S: Settings, p: Power) -> Findings:
    pn, un = p.needed("paired"), p.needed("unpaired")
    most = max(p.seeds)
    ledger.add("paired_fewer_seeds", f"Resampled from the runs, a paired comparison finds B worse {TARGET:.0%} of the "
               f"time with fewer seeds than an unpaired one (unpaired seeds ÷ paired seeds; more than {most} counts as "
               f"{most + 1})", (un or most + 1) / (pn or most + 1), at_least(1.0), kind="measured")
    say = lambda n: f"**{n}**" if n else f"more than **{most}**"  # noqa: E731
    return Findings([
        f"For this difference, paired by seed, about {say(pn)} seeds find it four times in five; unpaired, "
        f"{say(un)}.",
        "The smaller the difference beside the seed-to-seed spread, the more seeds: halve it and the count "
        "quadruples.",
    ], [f"The formula, from the runs' spread and mean difference: {p.formula_paired:.1f} seeds paired, "
        f"{p.formula_unpaired:.1f} unpaired.",
        f"Resampled {DRAWS:,} times per count from the {S.seeds} runs of each recipe: with few runs, a rough guide."])
