"""Evidence over seeds: an interval for a mean, for a paired or an unpaired difference, and for a share of
exact answers; what the claims ledger states when a comparison is made over several runs.

    d = paired(cosine_losses, constant_losses)       # the same seeds for both recipes: one difference per seed
    d.low, d.high, d.p_value, d.n                    # a 95% Student t interval, a two-sided p-value, n seeds
    ledger.add("decay_helps", "...", d, below(0.0), kind="measured")   # its interval lies below 0

Student's t (the seeds are few, their spread estimated from themselves): mean ± t(n−1, (1 + c)/2) · s / √n with s
the sample standard deviation (n − 1 in the denominator). Unpaired: Welch's interval, each recipe with its own
spread. A share of k exact answers out of n: Wilson's score interval. The t quantiles come from scipy.special
(stdtrit), imported only when an interval is made; lesson 18 checks the learner's interval against scipy.stats.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from labtools.validate import check_range


@dataclass(frozen=True)
class Interval:
    """An estimate over n runs with its confidence interval; for a difference, the two-sided p-value of 'no
    difference' too."""
    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    p_value: float | None = None
    what: str = "mean"  # "mean", "paired difference", "unpaired difference", "share"
    over: str = "runs"  # what n counts: runs (seeds), problems, answers

    def __str__(self) -> str:
        p = f", p = {self.p_value:.2g}" if self.p_value is not None else ""
        return (f"{_fmt(self.estimate)} [{_fmt(self.low)}, {_fmt(self.high)}] ({self.confidence:.0%}, {self.n} "
                f"{self.over}{p})")

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _check(values: Sequence[float], confidence: float, name: str = "seeds") -> list[float]:
    check_range("confidence", confidence, 0.0, 1.0, open_lo=True, open_hi=True)
    values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError(f"{name}: an interval needs at least 2 runs (seeds), got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name}: every value must be a finite number, got {values}")
    return values


def t_quantile(df: float, q: float) -> float:
    """The q quantile of Student's t with df degrees of freedom."""
    from scipy.special import stdtrit
    return float(stdtrit(df, q))


def _two_sided_p(t: float, df: float) -> float:
    from scipy.special import stdtr
    return float(2 * stdtr(df, -abs(t))) if math.isfinite(t) else 0.0


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student's t interval for the mean of values from n independent runs."""
    v = _check(values, confidence)
    n, m = len(v), sum(v) / len(v)
    s = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    half = t_quantile(n - 1, (1 + confidence) / 2) * s / math.sqrt(n)
    t = m / (s / math.sqrt(n)) if s > 0 else (math.inf if m else 0.0)
    return Interval(m, m - half, m + half, n, confidence, _two_sided_p(t, n - 1) if s > 0 or m else 1.0)


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, over: str = "runs") -> Interval:
    """a − b pair by pair (runs with the same seeds, or answers to the same problems): the interval of the mean
    difference and its p-value."""
    if len(a) != len(b):
        raise ValueError(f"paired runs need as many of each: {len(a)} and {len(b)}")
    out = mean_interval([x - y for x, y in zip(a, b)], confidence)
    return Interval(out.estimate, out.low, out.high, out.n, confidence, out.p_value, "paired difference", over)


def unpaired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """mean(a) − mean(b) from independent runs: Welch's interval (each side its own spread) and p-value."""
    a, b = _check(a, confidence, "a"), _check(b, confidence, "b")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    half = t_quantile(df, (1 + confidence) / 2) * se
    d = ma - mb
    p = _two_sided_p(d / se, df) if se > 0 else (0.0 if d else 1.0)
    return Interval(d, d - half, d + half, min(len(a), len(b)), confidence, p, "unpaired difference")


def share(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson's score interval for a share of k successes (exact answers) out of n."""
    check_range("confidence", confidence, 0.0, 1.0, open_lo=True, open_hi=True)
    check_range("n", n, 1, None, int)
    check_range("k", k, 0, n, int)
    from scipy.special import ndtri
    z = float(ndtri((1 + confidence) / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n, confidence, None, "share", "answers")


def table(rows: list[tuple[str, Interval]], label: str = "comparison") -> str:
    """Intervals as a markdown table: estimate, interval, how many, p-value."""
    head = f"| {label} | estimate | interval | n | p-value |\n|---|---|---|---|---|\n"
    return head + "\n".join(f"| {name} | {_fmt(i.estimate)} | [{_fmt(i.low)}, {_fmt(i.high)}] | {i.n} {i.over} | "
                            f"{'' if i.p_value is None else f'{i.p_value:.2g}'} |" for name, i in rows)
