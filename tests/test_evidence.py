"""labtools.evidence against scipy.stats, the ledger's claims over seeds (each fails for the wrong alternative), bad
input refused, labtools.tasks' grading, and lesson 18's exercise: the solution passes and typical mistakes are named."""

import math
import statistics

import pytest
import torch
from scipy import stats

from labtools import evidence
from labtools.claims import Ledger, above, below, within
from labtools.tasks import Addition, complete, exact_match
from learner_files import load
from lessons import evidence as lesson
from lessons.evidence import interval_exercise as ix

A = [2.51, 2.48, 2.55, 2.47, 2.52, 2.50]
B = [2.49, 2.47, 2.50, 2.46, 2.50, 2.51]


def test_intervals_and_p_values_are_scipys():
    p = evidence.paired(A, B, 0.9)
    r = stats.ttest_rel(A, B)
    ci = r.confidence_interval(0.9)
    assert (p.low, p.high, p.p_value) == pytest.approx((ci.low, ci.high, r.pvalue), rel=1e-9)
    u = evidence.unpaired(A, B)
    w = stats.ttest_ind(A, B, equal_var=False)
    assert (u.low, u.high, u.p_value) == pytest.approx((*w.confidence_interval(0.95), w.pvalue), rel=1e-9)
    m = evidence.mean_interval(A)
    assert (m.low, m.high) == pytest.approx(stats.t.interval(0.95, 5, loc=statistics.fmean(A), scale=stats.sem(A)))
    s = evidence.share(37, 50)
    assert (s.low, s.high) == pytest.approx(tuple(stats.binomtest(37, 50).proportion_ci(method="wilson")))


@pytest.mark.parametrize("bad, name", [(lambda: evidence.mean_interval([1.0]), "at least 2"),
                                       (lambda: evidence.paired(A, B, confidence=1.0), "confidence"),
                                       (lambda: evidence.paired(A, B, confidence=0.0), "confidence"),
                                       (lambda: evidence.paired(A, B[:3]), "as many"),
                                       (lambda: evidence.share(5, 3), "k")])
def test_bad_input_is_refused_naming_what(bad, name):
    with pytest.raises(ValueError, match=name):
        bad()


def test_a_claim_over_seeds_holds_only_for_its_whole_interval():
    shifted = [x + 0.01 for x in B]
    ledger = Ledger("t")
    ledger.add("real", "B + 0.01 is worse than B", evidence.paired(shifted, B), above(0.0), kind="measured")
    assert ledger.all_passed and "6 seeds" in ledger.to_text()
    noise = [x + e for x, e in zip(B, (0.004, -0.003, 0.002, -0.004, 0.003, -0.002))]  # no difference, only noise
    ledger.add("absent", "a difference that is not there", evidence.paired(noise, B), above(0.0), kind="measured")
    ledger.add("not_below", "nor below", evidence.paired(noise, B), below(0.0), kind="measured")
    assert [c.passed for c in ledger.claims] == [True, False, False]
    ledger.add("same", "the same to 0.01", evidence.paired(noise, B), within(0.01), kind="measured")
    ledger.add("too_tight", "the same to 0.001", evidence.paired(noise, B), within(0.001), kind="measured")
    assert [c.passed for c in ledger.claims][3:] == [True, False]
    with pytest.raises(ValueError, match="over seeds"):
        Ledger("t").add("one", "one run", 0.3, above(0.0), kind="measured")


def test_addition_is_graded_exactly_and_its_lines_have_one_shape():
    task = Addition(2)
    train, test = task.split(0.2, seed=0)
    assert len(train) == 8000 and len(test) == 2000 and not set(p.prompt for p in train) & set(p.prompt for p in test)
    assert {len(p.line) for p in train} == {task.line_len} and Addition.verify(test[0], test[0].answer + "\n")
    assert not Addition.verify(test[0], test[0].answer[:-1] + "\n")
    X, Y = task.examples(train[:4])
    assert (Y[:, :5] == -100).all() and (Y[:, 5:] >= 0).all()  # the loss counts the answer and its end of line

    class Oracle(torch.nn.Module):  # answers every problem right: exact match 1, its interval reaching 1
        config = type("C", (), {"block_size": 16})

        def __init__(self, corpus):
            super().__init__()
            self.corpus, self.w = corpus, torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            out = torch.full((x.size(0), x.size(1), len(self.corpus.itos)), -1e9)
            for r in range(x.size(0)):
                text = self.corpus.decode(x[r].tolist())
                a, b = text[:5].split("+")
                line = f"{text[:6]}{int(a) + int(b[:2]):03d}\n"
                nxt = line[len(text)] if len(text) < len(line) else "\n"
                out[r, -1, self.corpus.itos.index(nxt)] = 0
            return out, None

    corpus = task.corpus(train[:1], test)
    graded = exact_match(Oracle(corpus), corpus, test[:50])
    assert graded.score.estimate == 1.0 and graded.score.high == 1.0 and graded.score.low < 1.0
    assert complete(Oracle(corpus), corpus, [test[0].prompt], 4)[0] == test[0].answer + "\n"


def _paired(tmp_path, body: str):
    return load(tmp_path, "import math\nimport statistics\nfrom labtools.evidence import t_quantile\n\n"
                "def my_paired_interval(a, b, confidence):\n" + body, "my_paired_interval")


def test_the_interval_exercise_passes_the_solution_and_names_typical_mistakes(tmp_path):
    solution = load(tmp_path, "import math\nfrom labtools.evidence import t_quantile\n\n" + ix.solution_source(),
                    "my_paired_interval")
    assert ix.check_interval(solution, (A, B)).passed
    mistakes = {  # body -> words of the hint that must name it
        "    d = [x - y for x, y in zip(a, b)]\n    m = statistics.fmean(d)\n    h = t_quantile(len(d) - 1, (1 + "
        "confidence) / 2) * statistics.pstdev(d) / math.sqrt(len(d))\n    return m, m - h, m + h\n": "n − 1, not n",
        "    d = [x - y for x, y in zip(a, b)]\n    m = statistics.fmean(d)\n    h = 1.959963984540054 * "
        "statistics.stdev(d) / math.sqrt(len(d))\n    return m, m - h, m + h\n": "Student's t",
        "    m = statistics.fmean(a) - statistics.fmean(b)\n    h = t_quantile(len(a) - 1, (1 + confidence) / 2) * "
        "math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))\n    return m, m - h, "
        "m + h\n": "differences seed by seed",
        "    d = [x - y for x, y in zip(a, b)]\n    m = statistics.fmean(d)\n    h = t_quantile(len(d) - 1, (1 + "
        "confidence) / 2) * statistics.stdev(d)\n    return m, m - h, m + h\n": "divided by √n",
    }
    for body, hint in mistakes.items():
        out = ix.check_interval(_paired(tmp_path, body), (A, B))
        assert out.status == "fail" and hint in out.message, (hint, out.message)


def test_the_lessons_claims_hold_and_bad_settings_are_refused():
    S = lesson.settings("smoke")
    for bad, name in ((dict(seeds=1), "SEEDS"), (dict(confidence=1.5), "CONFIDENCE"), (dict(task_problems=0),
                                                                                       "TASK_PROBLEMS")):
        with pytest.raises(ValueError, match=name):
            lesson.settings("smoke", **bad)
    from lessons.evidence import difference, power, same
    c = difference.run(S)
    ledger = Ledger("t")
    difference.findings(ledger, S, c)
    same.findings(ledger, S, same.run(S, c))
    power.findings(ledger, S, power.run(S, c))
    assert ledger.all_passed, ledger.to_text()
    # recipes swapped: "B is worse" must fail
    swapped = difference.Comparison(c.b, c.a, evidence.paired(c.a, c.b), evidence.unpaired(c.a, c.b))
    ledger = Ledger("t")
    difference.findings(ledger, S, swapped)
    assert not {k.key: k for k in ledger.claims}["b_worse"].passed
    assert math.isfinite(c.paired.p_value)


def test_comparisons_made_over_seeds_at_the_cpu_profile_fail_when_the_difference_is_absent():
    """Lessons 02, 04 and 17 claim their comparison of recipes over seeds, paired (the cpu profile's runs); a claim
    over seeds holds for the measured direction and fails for the other, or for runs that only scatter."""
    from labtools.train import History
    from lessons import lr_schedules, mixed_precision, tokens
    from lessons.lr_schedules import equal_budget
    from lessons.mixed_precision import master_weights
    from lessons.tokens import comparison

    S = lr_schedules.settings("smoke", seeds=4)
    names = ["constant (after warmup)", "cosine", "linear", "WSD (cosine decay)"]
    runs = {n: History(val_step=[1], val_loss=[v]) for n, v in zip(names, (1.99, 1.89, 1.87, 1.87))}
    for seeds, holds in ((([1.99, 1.98, 2.00, 1.97], [1.89, 1.90, 1.88, 1.91]), True),
                         (([1.89, 1.90, 1.88, 1.91], [1.99, 1.98, 2.00, 1.97]), False),
                         (([1.90, 1.89, 1.91, 1.88], [1.89, 1.90, 1.88, 1.91]), False)):
        ledger = Ledger("t")
        equal_budget.findings(ledger, S, runs, seeds)
        assert {c.key: c for c in ledger.claims}["decay_beats_constant"].passed is holds

    M = mixed_precision.settings("smoke")
    master = master_weights.run(M)
    for seeds, holds in ((([2.353, 2.355, 2.356], [2.323, 2.335, 2.331]), True),
                         (([2.323, 2.335, 2.331], [2.353, 2.355, 2.356]), False)):
        ledger = Ledger("t")
        master_weights.findings(ledger, master, seeds)
        assert {c.key: c for c in ledger.claims}["master_lower_loss"].passed is holds

    T = tokens.settings("smoke")
    h = History(val_step=[1], val_loss=[2.3])
    def trained(name, nats, n_tokens):
        return comparison.Trained(name, History(val_step=[1], val_loss=[nats]), 100, n_tokens, 1000, 1e6)
    better = {"characters": trained("c", 2.3, 1000), "BPE": trained("b", 3.9, 450),
              "characters, seed 1": trained("c", 2.32, 1000), "BPE, seed 1": trained("b", 3.95, 450)}
    ledger = Ledger("t")
    comparison.findings(ledger, T, better)
    assert {c.key: c for c in ledger.claims}["per_byte_bpe"].passed and "2 seeds" in ledger.to_text()
    same = {**better, "BPE": trained("b", 2.3, 1000), "BPE, seed 1": trained("b", 2.32, 1000)}
    ledger = Ledger("t")
    comparison.findings(ledger, T, same)
    assert not {c.key: c for c in ledger.claims}["per_byte_bpe"].passed
    assert h.final_val_loss == 2.3
