"""Lesson 20 and labtools.chat / labtools.posttrain: the template and its masks, the losses against PyTorch and the
formula, the two exercises' checks and hints, the settings' refusals, and each headline claim failing for the wrong
alternative (the base graded in the format it read, a fine-tune from random weights, a prompt without the tag, DPO
on swapped pairs, a small β)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from labtools import chat, posttrain
from labtools.claims import Ledger
from labtools.evidence import share
from labtools.tasks import Addition, Graded
from lessons import finetune as lesson
from lessons.finetune import TEMPLATE, base, dpo, dpo_exercise, sft, sft_exercise

S = lesson.settings("smoke")


@pytest.fixture(scope="module")
def base_model():
    return chat.pretrained(S.recipe)


@pytest.fixture(scope="module")
def tuned(base_model):
    return sft.run(S, base_model)


def claim(ledger: Ledger, key: str):
    return next(c for c in ledger.claims if c.key == key)


# --- the template, sampling, and the losses against PyTorch's and the paper's ------------------------------------

def test_the_template_keeps_each_digit_where_the_plain_text_had_it_and_masks_the_question():
    p = Addition(2).problems()[745]  # 07+45
    assert (p.prompt, TEMPLATE.prompt(p), TEMPLATE.line(p)) == ("07+45=", "07+45▶", "07+45▶052■")
    X, Y = TEMPLATE.examples([p])
    assert chat.decode(X[0]) == "07+45▶052"
    assert Y[0].tolist()[:5] == [chat.IGNORE] * 5 and chat.decode(Y[0, 5:]) == "052■"  # after "▶": the answer
    _, Y_all = TEMPLATE.examples([p], mask=False)
    assert chat.decode(Y_all[0]) == "7+45▶052■"
    with pytest.raises(ValueError, match="Template.assistant"):
        chat.Template(assistant="7")
    with pytest.raises(ValueError, match="outside the chat vocabulary"):
        chat.encode("07+45?")


def test_sampling_stops_each_answer_at_its_end_tag_and_flags_truncation(base_model):
    s = chat.sample(base_model, ["07+45="] * 3, 6, temperature=0.0, end="\n")
    assert s.text == ["052\n"] * 3 and not s.truncated.any()  # greedy: the same completion, cut after the break
    assert s.mask[0].tolist() == [True] * 4 + [False] * 2
    short = chat.sample(base_model, ["07+45="], 2, temperature=0.0, end="\n")
    assert short.truncated.all() and short.text == ["05"]
    with pytest.raises(ValueError, match="temperature"):
        chat.sample(base_model, ["07+45="], 2, temperature=-1.0)


def test_the_kv_cache_gives_the_models_own_logits_and_the_same_samples(base_model):
    """The cache computes the last position's logits from stored keys and values: the full forward's, to rounding;
    sampled with the same generator, the same answers."""
    x = torch.tensor([chat.encode("07+45=052"), chat.encode("99+99=198")])
    kv = chat.KVCache(base_model)
    with torch.no_grad():
        steps = [kv.step(x[:, :6])] + [kv.step(x[:, t:t + 1]) for t in range(6, 9)]
        full = base_model(x)[0]
    for i, logits in enumerate(steps):
        assert torch.allclose(logits, full[:, 5 + i], atol=1e-5), i
    prompts = [p.prompt for p in Addition(2).problems()[:64]]
    a = chat.sample(base_model, prompts, 4, 1.0, torch.Generator().manual_seed(1), end="\n", cache=True)
    b = chat.sample(base_model, prompts, 4, 1.0, torch.Generator().manual_seed(1), end="\n", cache=False)
    assert a.text == b.text
    with pytest.raises(ValueError, match="block_size"):
        chat.KVCache(base_model).step(torch.zeros(1, base_model.config.block_size + 1, dtype=torch.long))


def test_the_sft_loss_is_pytorchs_cross_entropy_with_ignore_index():
    logits, targets = sft_exercise._ragged(5)
    expected = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
    assert torch.allclose(posttrain.sft_loss(logits, targets), expected)
    assert torch.allclose(sft_exercise.reference(logits, targets), expected, atol=1e-6)


def test_the_dpo_loss_is_the_papers_formula_written_out_in_python():
    """Rafailov et al. 2023, eq. 7, one pair at a time in plain floats: −log σ(β[(πw − rw) − (πl − rl)])."""
    pw, pl, rw, rl = dpo_exercise._logprobs(6, 3)
    for beta in (0.1, 1.0):
        by_hand = [math.log1p(math.exp(-beta * ((a - c) - (b - d)))) for a, b, c, d in
                   zip(pw.tolist(), pl.tolist(), rw.tolist(), rl.tolist())]
        assert abs(posttrain.dpo_loss(pw, pl, rw, rl, beta).item() - sum(by_hand) / len(by_hand)) < 1e-12
        assert abs(dpo_exercise.reference(pw, pl, rw, rl, beta).item() - sum(by_hand) / len(by_hand)) < 1e-12


def test_group_advantages_centre_and_scale_each_group_and_give_a_flat_group_nothing():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = posttrain.group_advantages(r)
    assert torch.allclose(a[0], (r[0] - 0.5) / (r[0].std() + 1e-4)) and torch.equal(a[1], torch.zeros(4))


# --- the exercises -------------------------------------------------------------------------------------------------

def test_the_sft_check_passes_the_solution_and_pytorchs_and_names_each_mistake():
    namespace = {"torch": torch}
    exec(sft_exercise.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    assert sft_exercise.check_sft_loss(namespace["my_sft_loss"]).passed
    assert sft_exercise.check_sft_loss(sft_exercise.lab).passed

    def pick(logits, targets):
        logp = torch.log_softmax(logits.float(), -1)
        keep = targets != -100
        return logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0], keep

    def every_position(logits, targets):
        picked, keep = pick(logits, targets)
        return -(picked * keep).sum() / keep.numel()

    def summed(logits, targets):
        picked, keep = pick(logits, targets)
        return -(picked * keep).sum()

    def row_by_row(logits, targets):
        picked, keep = pick(logits, targets)
        return -((picked * keep).sum(1) / keep.sum(1)).mean()

    def unmasked(logits, targets):
        return -pick(logits, targets)[0].mean()

    def no_minus(logits, targets):
        picked, keep = pick(logits, targets)
        return (picked * keep).sum() / keep.sum()

    def shifted(logits, targets):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), targets[:, 1:].reshape(-1))

    def gathers_minus_100(logits, targets):
        return -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()

    mistakes = {every_position: "not by every position", summed: "not a sum", row_by_row: "not row by row",
                unmasked: "leave out the positions whose target is -100", no_minus: "minus the log-probability",
                shifted: "no second shift", gathers_minus_100: "-100"}
    for fn, hint in mistakes.items():
        out = sft_exercise.check_sft_loss(fn)
        assert out.status == "fail" and hint in out.message, (fn.__name__, out.message)


def test_the_dpo_check_passes_the_solution_and_names_each_mistake():
    namespace = {"F": F}
    exec(dpo_exercise.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    assert dpo_exercise.check_dpo_loss(namespace["my_dpo_loss"]).passed

    def swapped(pw, pl, rw, rl, beta):
        return -F.logsigmoid(beta * ((pl - rl) - (pw - rw))).mean()

    def no_reference(pw, pl, rw, rl, beta):
        return -F.logsigmoid(beta * (pw - pl)).mean()

    def beta_outside(pw, pl, rw, rl, beta):
        return -beta * F.logsigmoid((pw - rw) - (pl - rl)).mean()

    def no_beta(pw, pl, rw, rl, beta):
        return -F.logsigmoid((pw - rw) - (pl - rl)).mean()

    def sigmoid_only(pw, pl, rw, rl, beta):
        return -torch.sigmoid(beta * ((pw - rw) - (pl - rl))).mean()

    def summed(pw, pl, rw, rl, beta):
        return -F.logsigmoid(beta * ((pw - rw) - (pl - rl))).sum()

    def unstable(pw, pl, rw, rl, beta):
        return -torch.log(torch.sigmoid(beta * ((pw - rw) - (pl - rl)))).mean()

    mistakes = {swapped: "comes first", no_reference: "against the reference model", beta_outside: "not the loss "
                "outside", no_beta: "multiply the margin by β", sigmoid_only: "not −σ(margin)",
                summed: "not a sum", unstable: "logsigmoid"}
    for fn, hint in mistakes.items():
        out = dpo_exercise.check_dpo_loss(fn)
        assert out.status == "fail" and hint in out.message, (fn.__name__, out.message)


# --- the settings --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, name", [(dict(betas=()), "BETAS"), (dict(betas=(0.0,)), "BETAS"),
                                             (dict(test=2001), "TEST"), (dict(demos=7000), "DEMOS"),
                                             (dict(noise=1.5), "NOISE"), (dict(digits=1), "DIGITS")])
def test_bad_settings_are_refused_naming_the_parameter(overrides, name):
    with pytest.raises(ValueError, match=name):
        lesson.settings("smoke", **overrides)


def test_bad_arguments_to_the_loops_are_refused_naming_them(base_model):
    with pytest.raises(ValueError, match="group"):
        posttrain.grpo(base_model, TEMPLATE, Addition(2).problems()[:4], steps=1, group=1)
    with pytest.raises(ValueError, match="kl_weight"):
        posttrain.grpo(base_model, TEMPLATE, Addition(2).problems()[:4], steps=1, kl_weight=-0.1)
    with pytest.raises(ValueError, match="temperature"):
        posttrain.grpo(base_model, TEMPLATE, Addition(2).problems()[:4], steps=1, temperature=0.0)
    with pytest.raises(ValueError, match="beta"):
        posttrain.dpo(base_model, TEMPLATE, [], steps=1, beta=0.0)
    with pytest.raises(ValueError, match="at least one pair"):
        posttrain.dpo(base_model, TEMPLATE, [], steps=1, beta=0.5)


# --- the claims, and the wrong alternative each refuses ---------------------------------------------------------

def test_the_base_claims_hold_and_fail_for_a_model_that_knows_the_template(base_model, tuned):
    b = base.run(S)
    good = Ledger("20")
    base.findings(good, b)
    assert good.all_passed, good.to_text()
    wrong = Ledger("20")
    base.findings(wrong, dataclasses.replace(b, chat=tuned.graded))  # graded as if the base knew the template
    assert not claim(wrong, "base_no_chat").passed


def test_fine_tuning_claims_hold_and_fail_from_random_weights_or_graded_without_the_tag(base_model, tuned):
    good = Ledger("20")
    sft.findings(good, S, share(0, 400), tuned)
    assert good.all_passed, good.to_text()
    scratch = sft.tune(S, chat.new_model(S.recipe), lesson.problems(S).demos)
    wrong = Ledger("20")
    sft.findings(wrong, S, share(0, 400), scratch)
    assert not claim(wrong, "sft_learns_format").passed
    untagged = dataclasses.replace(tuned, prompts=[p[:-1] for p in tuned.prompts])  # the tag left out when graded
    wrong = Ledger("20")
    sft.findings(wrong, S, share(0, 400), untagged)
    assert not claim(wrong, "graded_with_tag").passed


def test_the_ablation_and_mismatch_claims_hold_and_fail_for_the_wrong_alternative(base_model, tuned):
    a = sft.ablation(S, base_model, tuned)
    good = Ledger("20")
    sft.ablation_findings(good, S, a)
    assert good.all_passed, good.to_text()
    assert a.mask_effect is None  # one seed: a recipe's comparison is not made
    wrong = Ledger("20")
    same = sft.Ablation(a.masked, a.unmasked, a.masked, dataclasses.replace(a.needs_base, low=-0.01), None, False,
                        a.masked_loss, a.masked_loss, a.entropy_floor)  # scratch as good as the base, the mask's loss
    sft.ablation_findings(wrong, S, same)
    assert not claim(wrong, "base_needed").passed and not claim(wrong, "unmasked_loss_floor").passed
    m = sft.mismatch(S, tuned)
    good = Ledger("20")
    sft.mismatch_findings(good, m)
    assert good.all_passed, good.to_text()
    asked_right = dict(m.scores)
    asked_right["no assistant tag (07+45)"] = m.scores["the template (07+45▶)"]
    wrong = Ledger("20")
    sft.mismatch_findings(wrong, dataclasses.replace(m, scores=asked_right))
    assert not claim(wrong, "no_tag_fails").passed


def test_dpo_claims_hold_and_fail_on_swapped_pairs_and_at_a_small_beta(base_model, tuned):
    small = dataclasses.replace(S, betas=(1.0, 0.1))
    p = dpo.run(small, base_model, tuned)
    good = Ledger("20")
    dpo.findings(good, small, p)
    assert good.all_passed, good.to_text()
    swapped = [posttrain.Pair(x.problem, x.rejected, x.chosen) for x in p.pairs]  # the verifier's verdicts reversed
    bad = dpo.dpo_at(small, p.noisy, swapped, 1.0)
    gain = exact_difference(bad.graded, p.noisy.graded)
    wrong = Ledger("20")
    dpo.findings(wrong, small, dataclasses.replace(p, runs={1.0: bad, 0.1: p.runs[0.1]}, gain=gain))
    assert not claim(wrong, "dpo_improves").passed
    wrong = Ledger("20")
    dpo.findings(wrong, small, dataclasses.replace(p, beta=0.1))  # the small β as the lesson's
    assert not claim(wrong, "chosen_likelier").passed
    clean = Ledger("20")
    p0 = dataclasses.replace(p, noise_cost=exact_difference(tuned.graded, tuned.graded))
    dpo.findings(clean, small, p0)
    assert not claim(clean, "noisy_sft_weaker").passed  # no noise: no cost


def exact_difference(a: Graded, b: Graded):
    from labtools.evidence import paired
    return paired([float(r) for r in a.right], [float(r) for r in b.right], S.confidence, over="problems")


def test_your_losses_fine_tune_and_run_dpo_as_the_labs_do_and_a_wrong_one_parts(base_model, tuned):
    assert sft.with_yours(S, base_model, tuned, sft_exercise.reference).outcome.passed

    def summed(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")

    out = sft.with_yours(S, base_model, tuned, summed).outcome
    assert out.status == "fail" and "parts from the lab's at step 1" in out.message, out.message
