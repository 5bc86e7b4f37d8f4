"""Hand-computed ANLS and exact-match P/R/F1, including empty and missing values."""

import pytest

from pipkie.metrics import Scores, anls_score


@pytest.mark.parametrize("pred,gold,expected", [
    ("9.00", "9.00", 1.0),
    ("helo", "hello", 0.8),  # 1 edit / 5 characters
    ("Hello  World ", "hello world", 1.0),  # case and whitespace normalised
    ("abc", "xyz", 0.0),
    ("ab", "abcd", 0.0),  # distance 2/4 = 0.5 reaches the threshold → 0
    ("abc", "abcd", 0.75),
    (None, None, 1.0),
    ("", None, 1.0),
    (None, "x", 0.0),
    ("x", None, 0.0),
    ("acme", ["acme sdn bhd", "acme"], 1.0),  # best of several gold values
])
def test_anls_cases(pred, gold, expected):
    assert anls_score(pred, gold) == pytest.approx(expected)


def test_scores_micro_prf_and_per_key():
    s = Scores()
    s.add_document({"company": "ACME", "total": "9.00"}, {"company": "ACME", "total": "9.50"}, ["company", "total"])
    s.add_document({"company": None, "total": "1.00"}, {"company": "BETA", "total": "1.00"}, ["company", "total"])
    s.add_document({"company": "X", "total": None}, {"company": None, "total": None}, ["company", "total"])
    out = s.summary()
    # predictions made: ACME, 9.00, 1.00, X = 4; gold values: ACME, 9.50, BETA, 1.00 = 4; correct: ACME, 1.00 = 2
    assert out["precision"] == pytest.approx(0.5)
    assert out["recall"] == pytest.approx(0.5)
    assert out["f1"] == pytest.approx(0.5)
    # ANLS company: 1 + 0 + 0 ; total: anls(9.00, 9.50) = 0.75, 1, 1 (both missing)
    assert out["per_key"]["company"]["anls"] == pytest.approx(1 / 3)
    assert out["per_key"]["total"]["anls"] == pytest.approx((0.75 + 1 + 1) / 3)
    assert out["anls"] == pytest.approx((1 + 0.75 + 1 + 1) / 6)
    assert out["per_key"]["company"]["precision"] == pytest.approx(0.5)  # ACME right, X wrong
    assert out["per_key"]["company"]["recall"] == pytest.approx(0.5)  # ACME found, BETA missed


def test_exact_match_is_case_sensitive_but_trims_whitespace():
    s = Scores()
    s.add("k", "  ACME  Sdn ", "ACME Sdn")
    s.add("k", "acme sdn", "ACME Sdn")
    out = s.summary()
    assert out["precision"] == pytest.approx(0.5)
    assert out["per_key"]["k"]["anls"] == pytest.approx(1.0)
