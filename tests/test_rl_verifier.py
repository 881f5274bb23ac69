"""Lesson 21: the advantages exercise's check and hints, the settings' refusals, GRPO's loop (clip, KL, a flat
group's zero advantage), and each headline claim failing for the wrong alternative: a GRPO run that cannot learn,
a recipe whose gain over seeds is absent, and each silent failure planted in the lesson's own run."""

import dataclasses

import pytest
import torch

from labtools import chat, evidence
from labtools.claims import Ledger
from labtools.posttrain import grpo
from lessons import rl_verifier as lesson
from lessons.rl_verifier import TEMPLATE, adv_exercise, failures
from lessons.rl_verifier import grpo as section
from lessons.rl_verifier import start

S = lesson.settings("smoke")


@pytest.fixture(scope="module")
def st():
    return start.run(S)


@pytest.fixture(scope="module")
def learned(st):
    return section.run(S, st)


@pytest.fixture(scope="module")
def probes(st):
    return failures.probes(S, st)


def claim(ledger: Ledger, key: str):
    return next(c for c in ledger.claims if c.key == key)


def test_the_advantages_check_passes_either_standard_deviation_and_names_each_mistake():
    namespace = {}
    exec(adv_exercise.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    assert adv_exercise.check_advantages(namespace["my_group_advantages"]).passed
    assert adv_exercise.check_advantages(adv_exercise._population).passed  # the n-denominator convention

    def batch_mean(r):
        return (r - r.mean()) / (r.std() + 1e-4)

    def no_std(r):
        return r - r.mean(1, keepdim=True)

    def flipped(r):
        return (r.mean(1, keepdim=True) - r) / (r.std(1, keepdim=True) + 1e-4)

    def by_column(r):
        return (r - r.mean(0, keepdim=True)) / (r.std(0, keepdim=True) + 1e-4)

    def no_eps(r):
        return (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True)

    mistakes = {batch_mean: "each group's own mean", no_std: "divides by the group's standard deviation",
                flipped: "a right answer gets a positive one", by_column: "not within each column",
                no_eps: "add 0.0001"}
    for fn, hint in mistakes.items():
        out = adv_exercise.check_advantages(fn)
        assert out.status == "fail" and hint in out.message, (fn.__name__, out.message)


@pytest.mark.parametrize("overrides, name", [(dict(group=1), "GROUP"), (dict(kl_weight=-0.1), "KL_WEIGHT"),
                                             (dict(temperature=0.0), "TEMPERATURE"), (dict(max_new=3), "MAX_NEW"),
                                             (dict(clip=0.0), "CLIP")])
def test_bad_settings_are_refused_naming_the_parameter(overrides, name):
    with pytest.raises(ValueError, match=name):
        lesson.settings("smoke", **overrides)


def test_a_group_that_scored_alike_moves_nothing(st):
    """Answers cut short: every reward 0, every advantage 0, and the policy's weights do not change (the KL
    term's gradient is zero while the policy equals its reference)."""
    policy = chat.GPT(st.model.config)
    policy.load_state_dict(st.model.state_dict())
    before = [p.detach().clone() for p in policy.parameters()]
    r = grpo(policy, TEMPLATE, lesson.problems(S).pool, steps=3, max_new=S.answer_len - 1)
    assert r.reward == [0.0] * 3 and r.signal == [0.0] * 3 and min(r.truncated) > 0.9  # a short wrong answer may end
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_grpo_claims_hold_and_fail_for_a_run_that_cannot_learn(st, learned):
    good = Ledger("21")
    section.findings(good, S, learned)
    assert good.all_passed, good.to_text()
    frozen, r = section.train(S, st.model, S.seed, steps=10, lr=1e-9)  # a learning rate that moves nothing
    after = chat.grade(frozen, TEMPLATE, lesson.problems(S).test, S.confidence)
    gain = evidence.paired([float(x) for x in after.right], [float(x) for x in st.graded.right], S.confidence,
                           over="problems")
    wrong = Ledger("21")
    section.findings(wrong, S, dataclasses.replace(learned, after=after, gain=gain))
    assert not claim(wrong, "grpo_improves").passed


def test_the_recipe_claim_over_seeds_fails_when_the_gain_is_absent(learned):
    over = dataclasses.replace(evidence.mean_interval([0.02, -0.01, 0.0, 0.01]), what="paired difference",
                               over="seeds")
    wrong = Ledger("21")
    section.findings(wrong, S, dataclasses.replace(learned, over_seeds=over, seed_gains=[0.02, -0.01, 0.0, 0.01]))
    assert not claim(wrong, "grpo_recipe").passed
    real = dataclasses.replace(evidence.mean_interval([0.36, 0.30, 0.40, 0.33]), what="paired difference",
                               over="seeds")
    right = Ledger("21")
    section.findings(right, S, dataclasses.replace(learned, over_seeds=real))
    assert claim(right, "grpo_recipe").passed


def test_each_silent_failure_planted_in_the_lessons_run_breaks_its_guard(learned, probes):
    good = Ledger("21")
    failures.findings(good, learned, probes)
    assert good.all_passed, good.to_text()
    lessons_own, cut, untagged, cold = probes
    for probe, guard in ((cut, "not_truncated"), (untagged, "first_reward"), (cold, "signal")):
        planted = Ledger("21")
        failures.guards(planted, dataclasses.replace(learned, run=probe.run))
        assert not claim(planted, guard).passed, (probe.name, guard)
    assert cut.signal == untagged.signal == 0.0 and lessons_own.signal > failures.SIGNAL_FLOOR


def test_your_advantages_train_as_the_labs_do_and_wrong_ones_part(st, learned):
    assert section.with_yours(S, st, learned, adv_exercise.reference).outcome.passed

    def flipped(r):
        return (r.mean(1, keepdim=True) - r) / (r.std(1, keepdim=True) + 1e-4)

    out = section.with_yours(S, st, learned, flipped).outcome
    assert out.status == "fail" and "parts from the lab's" in out.message, out.message
