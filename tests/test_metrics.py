"""Hand-computed ANLS and exact-match P/R/F1, including empty, missing and multi-valued fields;
the shipped model's SROIE predictions rescored to the published numbers."""

import json
from pathlib import Path

import pytest

from pipkie.eval.metrics import Scores, anls_score, loose_exact, score_field, values

RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
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
        ("acme", ["acme sdn bhd", "acme"], 0.5),  # two gold values, one predicted: 1 / max(1, 2)
    ],
)
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


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("ACME LTD | BETA INC", ["ACME LTD", "BETA INC"], 1.0),  # the list a model writes (Document.value)
        ("BETA INC | ACME LTD", ["ACME LTD", "BETA INC"], 1.0),  # order does not matter
        ("ACME LTD | ACME LTD", ["ACME LTD", "BETA INC"], 0.5),  # each gold value is matched once
        ("ACME LTD", ["ACME LTD", "BETA INC"], 0.5),  # a missed value costs like a wrong one
        ("A1 | B2 | C3", ["A1", "B2"], 2 / 3),  # a surplus value too
        ("ACME LTX | BETA INC", ["ACME LTD", "BETA INC"], (0.875 + 1) / 2),
        (["acme ltd", "beta inc"], ["ACME LTD", "BETA INC"], 1.0),  # a list prediction
        (None, ["ACME LTD", "BETA INC"], 0.0),
        ("ACME LTD | BETA INC", None, 0.0),
    ],
)
def test_multi_valued_fields_are_matched_one_to_one(pred, gold, expected):
    assert anls_score(pred, gold) == pytest.approx(expected)


def test_matching_maximises_the_summed_anls():
    # pairing "abcx"-"abcx" (1.0) would leave "abcxyz"-"abcd" at 0 (distance 3/6 = 0.5 → 0);
    # the best one-to-one matching pairs "abcx"-"abcd" (0.75) and "abcxyz"-"abcx" (4/6), sum 1.4167
    assert anls_score("abcx | abcxyz", ["abcd", "abcx"]) == pytest.approx((0.75 + 4 / 6) / 2)


def test_multi_valued_exact_match_counts_values():
    s = Scores()
    s.add("party", "ACME LTD | BETA INC | GAMMA", ["ACME LTD", "BETA INC"])  # 2 right, 1 surplus
    s.add("party", "ACME LTD | ACME LTD", ["ACME LTD", "DELTA"])  # a value matches one gold value only
    out = s.summary()
    assert (out["precision"], out["recall"]) == (pytest.approx(3 / 5), pytest.approx(3 / 4))
    assert out["per_key"]["party"]["exact"] == 0.0  # neither field has exactly the gold values
    assert score_field("B | A", ["A", "B"]).exact and not score_field("A", ["A", "B"]).exact


def test_values_split_and_normalise():
    assert values("  ACME   LTD |  BETA ") == ["ACME LTD", "BETA"]
    assert values(["", " x "]) == ["x"] and values(None) == [] and values("") == []


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("KOREAN RESTAURANT", ["KOREANRESTAURANT"], True),  # spaces ignored (WildReceipt has none)
        ("Korean  restaurant", ["KOREAN RESTAURANT"], True),  # case ignored
        ("KOREAN RESTAURAN", ["KOREAN RESTAURANT"], False),
        (None, None, False),  # nothing predicted is never "right"
        ("B | A", ["A", "B"], True),
    ],
)
def test_loose_exact(pred, gold, expected):
    assert loose_exact(pred, gold) is expected


def test_anls_ignoring_whitespace_is_reported_beside_anls():
    """OCR's spaces against WildReceipt's space-less gold: an edit for ANLS, none ignoring whitespace."""
    s = score_field("KOREAN RESTAURANT", ["KOREANRESTAURANT"])
    assert s.anls == pytest.approx(1 - 1 / 17) and s.anls_nospace == 1.0
    assert score_field("K O R E A N", ["KOREAN"]).anls == pytest.approx(6 / 11)  # 5 edits of 11
    assert score_field("K O R E A N", ["KOREAN"]).anls_nospace == 1.0
    assert score_field(" ", None).anls_nospace == 1.0 and score_field("x", None).anls_nospace == 0.0
    scores = Scores()
    scores.add("company", "KOREAN RESTAURANT", ["KOREANRESTAURANT"])
    scores.add("total", "9.00", ["9.00"])
    out = scores.summary()
    assert out["anls_nospace"] == 1.0 and out["anls"] < 1.0
    assert out["per_key"]["company"]["anls_nospace"] == 1.0


@pytest.mark.parametrize("name", ["sroie-pip-long-refit", "sroie-ar-forced-long"])
def test_single_valued_scores_of_published_predictions_are_unchanged(name):
    """The SROIE numbers in results/ (shipped model: ANLS 94.6, F1 84.4) rescored by today's metric."""
    from pipkie.eval.evaluate import rescore

    published = json.loads((RESULTS / f"{name}.json").read_text())
    now = rescore(RESULTS / f"{name}.predictions.jsonl")
    assert now["anls"] == pytest.approx(published["anls"], abs=1e-12)
    assert now["f1"] == pytest.approx(published["f1"], abs=1e-12)
    for k, v in published["per_key"].items():
        assert (now["per_key"][k]["anls"], now["per_key"][k]["exact"]) == (
            pytest.approx(v["anls"]),
            pytest.approx(v["exact"]),
        )


def test_shipped_models_predictions_rescore_to_the_model_cards_numbers():
    from pipkie.eval.evaluate import rescore

    now = rescore(RESULTS / "sroie-pip-long-refit.predictions.jsonl")
    assert (round(100 * now["anls"], 1), round(100 * now["f1"], 1), now["n_docs"]) == (94.6, 84.4, 347)
