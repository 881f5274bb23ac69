"""Lesson 18, your turn: the paired t-interval of a difference between two recipes run on the same seeds, checked
against scipy.stats.ttest_rel's confidence interval; then your interval answers section 2 on the lesson's runs."""

import inspect
import math
import statistics

from labtools.evidence import t_quantile
from labtools.exercises import Case, Outcome, check

HINT = ("take the differences a_i − b_i seed by seed; their mean ± t · s / √n, with s their standard deviation "
        "(divided by n − 1) and t Student's quantile with n − 1 degrees of freedom at (1 + confidence) / 2")


def reference(a, b, confidence):
    """(mean difference, low, high): the paired Student t interval of a − b over runs with the same seeds."""
    d = [x - y for x, y in zip(a, b)]               # one difference per seed: what the seed shares cancels
    n = len(d)
    mean = sum(d) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))  # n − 1: the mean was estimated from the same d
    half = t_quantile(n - 1, (1 + confidence) / 2) * s / math.sqrt(n)
    return mean, mean - half, mean + half


def scipy_interval(a, b, confidence):
    """What scipy says: ttest_rel's interval for the mean of a − b."""
    from scipy import stats
    r = stats.ttest_rel(a, b)
    ci = r.confidence_interval(confidence_level=confidence)
    return statistics.fmean(x - y for x, y in zip(a, b)), float(ci.low), float(ci.high)


def cases(runs: tuple[list[float], list[float]] | None = None) -> list[Case]:
    out = [
        Case("five seeds", ([2.51, 2.48, 2.55, 2.47, 2.52], [2.49, 2.47, 2.50, 2.46, 2.50], 0.95),
             hint="the sample standard deviation divides by n − 1, not n: the mean was estimated from the same runs"),
        Case("two seeds", ([2.51, 2.48], [2.49, 2.45], 0.95),
             hint="with few seeds the spread is itself uncertain: use Student's t with n − 1 degrees of freedom "
                  "(12.7 for two seeds at 95%), not the normal 1.96"),
        Case("B better: a negative difference", ([2.40, 2.43, 2.41, 2.44], [2.46, 2.47, 2.45, 2.49], 0.95),
             hint="a − b, in that order: the interval may lie below zero"),
        Case("90% confidence", ([2.51, 2.48, 2.55, 2.47, 2.52, 2.50], [2.49, 2.47, 2.50, 2.46, 2.50, 2.51], 0.9),
             hint="the quantile is at (1 + confidence) / 2: 0.95 for a 90% interval, 0.975 for 95%"),
    ]
    if runs is not None:
        out.append(Case("this lesson's recipes B and A, seed by seed", (runs[0], runs[1], 0.95), hint=HINT))
    return out


def check_interval(fn, runs: tuple[list[float], list[float]] | None = None) -> Outcome:
    """Your interval against scipy.stats.ttest_rel on four sets of runs (and the lesson's own, given runs)."""
    out = check(fn, scipy_interval, cases(runs), tol=1e-9, what="your paired interval",
                against="scipy.stats.ttest_rel's interval")
    if out.status == "fail":
        for c in cases(runs):
            named = _misconception(fn, *c.args)
            if named and f"'{c.name}'" in out.message:
                return Outcome("fail", out.message.split(" — hint:")[0] + f" — hint: {named}", out.worst)
    return out


def _misconception(fn, a, b, confidence) -> str:
    """The typical mistake the learner's answer matches, in words ("" if none)."""
    try:
        got = tuple(float(v) for v in fn(list(a), list(b), confidence))
    except Exception:  # noqa: BLE001 - check() has reported their error already
        return ""
    d = [x - y for x, y in zip(a, b)]
    n, m = len(d), statistics.fmean(d)
    s1, sn = statistics.stdev(d), statistics.pstdev(d)
    t = t_quantile(n - 1, (1 + confidence) / 2)
    z = 1.959963984540054 if confidence == 0.95 else t_quantile(1e9, (1 + confidence) / 2)
    sa, sb = statistics.stdev(a), statistics.stdev(b)
    welch = t_quantile(n - 1, (1 + confidence) / 2) * math.sqrt(sa**2 / n + sb**2 / n)
    known = {
        "a paired interval is built from the differences seed by seed: the spread of a and of b each holds the "
        "seed's own luck, which the differences cancel": m + welch,
        "the normal 1.96 is for many runs: with few seeds use Student's t with n − 1 degrees of freedom": m + z * s1
        / math.sqrt(n),
        "the standard deviation of the runs divides by n − 1, not n": m + t * sn / math.sqrt(n),
        "the interval is for the mean: the spread of one difference, s, is divided by √n": m + t * s1,
    }
    return next((what for what, high in known.items() if len(got) == 3 and abs(got[2] - high) < 1e-9), "")


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_paired_interval(")
