"""Lesson 17: the merge-loop exercise (the solution passes, typical mistakes fail with the hint that names them, and
your merges tokenize the lesson), bad settings refused before any work, and each claim failing for the wrong
alternative."""

import dataclasses

import pytest

from labtools.claims import Ledger
from labtools.exercises import NOT_WRITTEN
from labtools.packing import Packing
from learner_files import load
from lessons import tokens
from lessons.tokens import bpe, bpe_exercise as bx, comparison, packing

S = tokens.settings("smoke")


def _solution(tmp_path):
    return load(tmp_path, bx.solution_source(), "my_bpe_merges")


def test_the_solution_passes_against_tiktokens_trainer_and_then_tokenizes_the_lesson(tmp_path):
    mine = _solution(tmp_path)
    out = bx.check_merges(mine, S)
    assert out.passed and "tiktoken's own trainer" in out.message, out.message
    lab = bpe.learn(S)
    yours = bx.learn_with_yours(mine, S, lab)
    assert yours.yours and yours.merges == lab and yours.outcome.passed


def _variant(tmp_path, old: str, new: str):
    source = bx.solution_source()
    assert old in source, old
    source = source.replace(old, new)
    if "i >= 0" in new:  # scanning from the right, the index steps down
        source = source.replace("                i += 1", "                i -= 1")
    return load(tmp_path, source, "my_bpe_merges")


MISTAKES = {  # (the change to the solution, the case it fails on, words of the hint)
    "ties to the largest pair": (("best = max(pairs, key=pairs.get)",
                                  "best = max(pairs, key=lambda p: (pairs[p], p))"), "first met wins", "met first"),
    "each piece counted once": (("pairs[pair] = pairs.get(pair, 0) + count", "pairs[pair] = pairs.get(pair, 0) + 1"),
                                "many times", "piece's pairs count as often"),
    "merged right to left": (("            i = 0\n            while i < len(tokens) - 1:",
                              "            i = len(tokens) - 2\n            while i >= 0:"), "three merges",
                             "split another way"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_fails_on_the_case_that_shows_it_with_its_hint(tmp_path, mistake):
    (old, new), case, hint = MISTAKES[mistake]
    out = bx.check_merges(_variant(tmp_path, old, new), S)
    assert out.status == "fail" and case in out.message and hint in out.message, out.message
    wrong = bx.learn_with_yours(_variant(tmp_path, old, new), S, bpe.learn(S))
    assert not wrong.yours and wrong.outcome.status == "fail"  # the lesson goes on with the lab's merges


def test_the_stub_is_not_written_and_runs_nothing():
    def my_bpe_merges(pieces, n_merges):
        raise NotImplementedError

    assert bx.check_merges(my_bpe_merges, S).message == NOT_WRITTEN
    assert not bx.learn_with_yours(my_bpe_merges, S, []).yours


@pytest.mark.parametrize("bad, name", [(dict(vocab_size=256), "VOCAB_SIZE"), (dict(row_len=1), "ROW_LEN"),
                                       (dict(vocab_size=8192, train_chars=2_000), "VOCAB_SIZE"),
                                       (dict(vocab_sweep=(512, 256)), "VOCAB_SWEEP")])
def test_bad_settings_are_refused_naming_the_parameter(bad, name):
    with pytest.raises(ValueError, match=name):
        tokens.settings("smoke", **bad)


def _trained(name, nats, vocab, tokens_, n_bytes):
    h = comparison.History(val_step=[1], val_loss=[nats])
    return comparison.Trained(name, h, vocab, tokens_, n_bytes, 1e6)


def test_the_per_byte_claim_fails_when_the_character_model_is_better_per_byte():
    # 2.3 nats a character against 3.9 a BPE token of 2.2 bytes: BPE is better per byte ...
    runs = {"characters": _trained("characters", 2.3, 100, 1000, 1000), "BPE": _trained("BPE", 3.9, 512, 450, 1000)}
    ledger = Ledger("t")
    comparison.findings(ledger, S, runs)
    assert ledger.all_passed
    # ... a BPE model no better per byte than the characters' (3.9 nats a token of one byte) fails it
    runs["BPE"] = _trained("BPE", 3.9, 512, 1000, 1000)
    ledger = Ledger("t")
    comparison.findings(ledger, S, runs)
    assert not {c.key: c for c in ledger.claims}["per_byte_bpe"].passed


def test_the_mask_claim_fails_for_a_model_that_attends_across_documents():
    merges = bpe.learn(S)
    small = dataclasses.replace(S, pack_steps=5, text_chars=100_000)
    p = packing.run(small, merges)
    ledger = Ledger("t")
    packing.findings(ledger, small, p)
    claims = {c.key: c for c in ledger.claims}
    assert claims["mask_keeps_inside"].passed and claims["concat_crosses"].passed
    assert claims["pad_waste"].passed and claims["concat_waste"].passed
    crossed = dataclasses.replace(p, crossing={**p.crossing, Packing.MASKED: p.crossing[Packing.CONCAT]})
    ledger = Ledger("t")
    packing.findings(ledger, small, crossed)
    assert not {c.key: c for c in ledger.claims}["mask_keeps_inside"].passed
