import json
import math

import pytest

from labtools.claims import MIME, Ledger, approx, at_least, at_most, between, is_true, read_ledgers


@pytest.mark.parametrize("expect, good, bad", [
    (approx(2.0, rel=0.1), 2.15, 2.25),
    (approx(2.0, abs=0.01), 1.995, 2.02),
    (between(1, 3), 3.0, 3.01),
    (at_least(5), 5, 4.99),
    (at_most(5), 5, 5.01),
    (is_true(), True, False),
])
def test_expectations_pass_and_fail(expect, good, bad):
    assert expect.check(good)
    assert not expect.check(bad)


def test_nan_never_passes():
    assert not at_most(1.0).check(math.nan)
    assert not approx(1.0, rel=1.0).check(float("nan"))


def test_approx_needs_exactly_one_tolerance():
    with pytest.raises(ValueError):
        approx(1.0)
    with pytest.raises(ValueError):
        approx(1.0, rel=0.1, abs=0.1)


def test_ledger_records_replaces_and_reports():
    ledger = Ledger("demo")
    ledger.add("a", "one is about one", 1.01, approx(1.0, rel=0.05), kind="measured")
    ledger.add("b", "two is small", 2.0, at_most(1.0), kind="computed")
    assert not ledger.all_passed
    ledger.add("b", "two is small", 0.5, at_most(1.0), kind="computed")  # same key replaces
    assert ledger.all_passed and [c.key for c in ledger.claims] == ["a", "b"]
    ledger.note("seconds", 1.5)
    html = ledger.to_html()
    assert "one is about one" in html and "2 of 2 hold" in html
    assert "[PASS]" in ledger.to_text()
    assert "<small>computed</small>" in html and "[PASS] two is small: computed 0.5" in ledger.to_text()


def test_every_claim_says_its_kind():
    ledger = Ledger("demo")
    with pytest.raises(TypeError):
        ledger.add("a", "no kind", 1.0, at_most(2.0))
    with pytest.raises(ValueError, match="kind must be one of"):
        ledger.add("a", "a guess", 1.0, at_most(2.0), kind="guessed")
    assert ledger.claims == []


def test_mimebundle_roundtrips_through_a_notebook():
    ledger = Ledger("demo")
    ledger.add("x", "x holds", 3, at_least(1), source="somewhere", kind="counted")
    bundle = ledger.mimebundle()
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": bundle}]}]}
    found = read_ledgers(json.loads(json.dumps(nb)))
    assert found == [ledger.to_dict()]
    assert found[0]["claims"][0]["passed"] is True
    assert set(bundle) == {"text/html", "text/plain", MIME}


def test_detail_claims_are_checked_but_folded_and_open_when_one_fails():
    ledger = Ledger("demo")
    ledger.add("headline", "the thing the text states", 1.0, approx(1.0, rel=0.01), kind="measured")
    ledger.add("plumbing", "it ran on gloo", True, is_true(), kind="measured", detail=True)
    html = ledger.to_html()
    assert html.index("the thing the text states") < html.index("<details>") < html.index("it ran on gloo")
    assert "1 more checks" in html and "measured</i> = read from your run" in html  # the legend
    ledger.add("plumbing", "it ran on gloo", False, is_true(), kind="measured", detail=True)
    assert not ledger.all_passed and "<details open>" in ledger.to_html() and "(1 failed)" in ledger.to_html()
    assert read_ledgers({"cells": [{"outputs": [{"data": ledger.mimebundle()}]}]})[0]["claims"][1]["detail"] is True
