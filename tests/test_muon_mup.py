"""Lesson 19: µP's model and groups, the Newton–Schulz exercise's check and hints, the settings' refusals, the law's
fit against scipy, and each headline claim failing for the wrong alternative."""

import dataclasses
import math

import pytest
import torch
from scipy import stats

from labtools.claims import Ledger
from labtools.evidence import paired
from lessons import muon_mup as lesson
from lessons.muon_mup import muon_vs_adamw, mup, ns_exercise, predict
from lessons.muon_mup.runs import Recipe, Run, model

S = lesson.settings("smoke")


def test_mup_is_sp_at_the_base_width_and_scales_init_and_logits_by_the_width_multiplier():
    x = torch.randint(0, 50, (2, S.block_size))
    with torch.no_grad():
        assert torch.equal(model(S, S.base_width, True, 0)(x)[0], model(S, S.base_width, False, 0)(x)[0])
    wide_sp, wide_mup = model(S, 4 * S.base_width, False, 3), model(S, 4 * S.base_width, True, 3)
    assert wide_mup.config.width_mult == 4.0 and wide_sp.config.width_mult == 1.0
    w_sp = dict(wide_sp.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    w_mup = dict(wide_mup.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    assert torch.allclose(w_mup, w_sp / 2)  # variance ÷ 4: standard deviation ÷ 2, same draws
    emb_sp, emb_mup = wide_sp.transformer.wte.weight, wide_mup.transformer.wte.weight
    assert torch.equal(emb_sp, emb_mup)  # embeddings keep theirs
    with torch.no_grad():
        wide_sp.lm_head.weight.fill_(0.01)
        wide_mup.lm_head.weight.fill_(0.01)
        h = torch.randn(1, 3, wide_sp.config.n_embd)
        assert torch.allclose(wide_mup.lm_head(h) / 4, wide_sp.lm_head(h) / 4)
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        dataclasses.replace(wide_mup.config, tie_embeddings=True)


def variant(**kw):
    return lambda G, steps=5: ns_exercise._variant(G, **kw).float()


def test_the_newton_schulz_check_passes_the_solution_and_rounding_and_names_each_mistake():
    assert ns_exercise.check_newton_schulz(ns_exercise.reference).passed
    fp32 = lambda G, steps=5: variant()(G) if G.size(0) <= G.size(1) else variant()(G.T).T  # noqa: E731
    assert ns_exercise.check_newton_schulz(fp32).passed  # no bf16: more exact, still the same iteration
    mistakes = {"the spectral norm": (variant(normalise="spectral"), "Frobenius norm"),
                "coefficients reversed": (variant(coefficients=ns_exercise.NS_COEFFICIENTS[::-1]), "in that order"),
                "four steps": (variant(steps=4), "five steps"),
                "the cubic iteration": (variant(coefficients=(1.5, -0.5, 0.0)), "quintic"),
                "no normalisation": (variant(normalise=None), "start from X = G / ‖G‖_F"),
                "the polynomial on the right": (variant(left=False), "from the left"),
                "an exact SVD": (lambda G, steps=5: (lambda U, S_, V: U @ V)(*torch.linalg.svd(G, full_matrices=False)),
                                 "does not compute the exact")}
    for name, (fn, hint) in mistakes.items():
        out = ns_exercise.check_newton_schulz(fn)
        assert out.status == "fail" and hint in out.message, (name, out.message)

    def stub(G, steps=5):
        raise NotImplementedError

    assert ns_exercise.check_newton_schulz(stub).status == "not written"
    out = ns_exercise.check_newton_schulz(lambda G, steps=5: G[:, :2])
    assert out.status == "fail" and "G's shape" in out.message


@pytest.mark.parametrize("change, name", [
    (dict(widths=(32, 16, 64)), "WIDTHS"), (dict(widths=(16,)), "WIDTHS"), (dict(lrs=(0.001, 0.01)), "LRS"),
    (dict(muon_lrs=(0.04, 0.02, 0.01)), "MUON_LRS"), (dict(ladder=(24, 16)), "LADDER"),
    (dict(big_width=32), "BIG_WIDTH"), (dict(n_embd=48, n_head=6), "N_EMBD"), (dict(budget=0.0), "BUDGET"),
    (dict(widths=(16, 20, 32)), "HEAD_DIM")])
def test_bad_settings_are_refused_naming_the_parameter(change, name):
    with pytest.raises(ValueError, match=name):
        dataclasses.replace(S, **change)


def test_a_ladder_takes_widths_or_width_and_steps_and_refuses_what_breaks_the_budget_or_the_law():
    from lessons.muon_mup.runs import flops
    assert predict.rungs(S) == tuple((w, S.steps_at(w)) for w in S.ladder)
    mine = predict.rungs(S, ((32, 40), 16), "MY_LADDER")
    assert set(mine) == {(32, 40), (16, S.steps_at(16))}
    assert [flops(S, *r) for r in mine] == sorted(flops(S, *r) for r in mine)  # in order of compute
    for bad, match in [((16, 24, 32, 40, 48), "MY_LADDER spends"), ((16, 64), "narrower than the big run"),
                       ((16,), "two or more"), ((16, (16, S.steps_at(16))), "different compute"),
                       ((16, 20), "multiple of HEAD_DIM"), ((16, (24, 0)), "steps a whole number"),
                       ((16, (24, 10, 3)), "a \\(width, steps\\) pair"), ("16, 24", "two or more")]:
        with pytest.raises(ValueError, match=match):
            predict.rungs(S, bad, "MY_LADDER")
    with pytest.raises(ValueError, match="BUDGET .* smaller than one run"):
        predict.rungs(dataclasses.replace(S, budget=0.001))


def test_the_law_is_a_least_squares_line_in_log_log_as_scipy_fits_it():
    C = [1e9, 3e9, 1e10, 4e10]
    L = [2.6, 2.48, 2.41, 2.30]
    law = predict.fit(C, L)
    r = stats.linregress([math.log(c) for c in C], [math.log(v) for v in L])
    assert law.gamma == pytest.approx(-r.slope, rel=1e-9) and math.log(law.a) == pytest.approx(r.intercept, rel=1e-9)
    exact = predict.fit(C, [5.0 * c ** -0.03 for c in C])
    assert exact(1e12) == pytest.approx(5.0 * 1e12 ** -0.03, rel=1e-9)


def claims(ledger: Ledger) -> dict[str, bool]:
    return {c.key: c.passed for c in ledger.claims}


def test_the_transfer_claims_fail_when_sp_stays_put_or_mup_moves():
    lrs, widths = S.lrs, S.widths
    moving = [[abs(i - (2 - k)) * 0.1 + 2.5 for i in range(len(lrs))] for k in range(len(widths))]  # best: 2, 1, 0
    still = [[abs(i - 2) * 0.1 + 2.5 for i in range(len(lrs))] for _ in widths]
    coords_ok = mup.Coordinates(widths, {"SP": {"block 1": [1.0, 2.0, 3.0]}, "µP": {"block 1": [1.0, 1.0, 1.1]}})
    good = Ledger("t")
    mup.findings(good, S, coords_ok, mup.Transfer(widths, lrs, {"SP": moving, "µP": still}))
    assert all(claims(good).values())
    bad = Ledger("t")
    coords_bad = mup.Coordinates(widths, {"SP": {"block 1": [1.0, 1.1, 1.2]}, "µP": {"block 1": [1.0, 2.0, 3.0]}})
    mup.findings(bad, S, coords_bad, mup.Transfer(widths, lrs, {"SP": still, "µP": moving}))
    assert not any(claims(bad)[k] for k in ("coord_sp", "coord_mup", "sp_drift", "mup_stays"))


def run(width, steps, final, losses=None, optimizer="adamw"):
    return Run(Recipe(width, steps, 0.01, optimizer), final, tuple(losses or [3.0] * steps), 1.0)


def test_muon_against_adamw_fails_when_muon_ends_higher_or_reaches_no_sooner():
    sweep = muon_vs_adamw.Sweep((0.001, 0.002, 0.004), (2.7, 2.6, 2.8), 0.002)
    a, m = [2.66, 2.69, 2.67], [2.51, 2.50, 2.52]
    good = muon_vs_adamw.Comparison(sweep, sweep, a, m, paired(m, a, over="seeds"), run(32, 80, 2.66),
                                    run(32, 80, 2.51), round(0.75 * S.steps), 1.5, True)
    ledger = Ledger("t")
    muon_vs_adamw.findings(ledger, S, good)
    assert claims(ledger)["muon_lower"] and claims(ledger)["muon_sooner"]
    bad = dataclasses.replace(good, muon_finals=a, adamw_finals=m, difference=paired(a, m, over="seeds"),
                              steps_to_match=None)
    ledger = Ledger("t")
    muon_vs_adamw.findings(ledger, S, bad)
    assert not claims(ledger)["muon_lower"] and not claims(ledger)["muon_sooner"]


def test_the_prediction_claim_fails_beyond_its_tolerance():
    compute = (1e9, 3e9, 1e10)
    law = predict.fit(compute, [2.5, 2.44, 2.4])
    ladder = predict.Ladder(((16, 10), (24, 10), (32, 10)),
                            tuple(run(w, 10, v) for w, v in zip((16, 24, 32), (2.5, 2.44, 2.4))),
                            compute, law, 1e11, law(1e11))
    for measured, holds in ((law(1e11) - 0.05, True), (law(1e11) - 0.3, False), (law(1e11) + 0.3, False)):
        ledger = Ledger("t")
        findings = predict.findings(ledger, S, predict.Graded(ladder, run(64, 40, measured), None))
        assert claims(ledger)["predicted"] is holds
        assert ("Yes" in findings.statements[0]) is holds
    yours = dataclasses.replace(ladder, rungs=((16, 10), (32, 10)), predicted=law(1e11) - 0.02)
    findings = predict.findings(Ledger("t"), S, predict.Graded(ladder, run(64, 40, law(1e11) - 0.05), yours))
    assert "Your ladder missed by 0.03 nats, nearer than the lab's." in findings.statements
