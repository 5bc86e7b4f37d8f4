"""The numbers around an evaluation, on data built so the answer is known: the paired bootstrap
(`pipkie compare`), calibration (ECE, the ≥ 0.9 share), and the CI rule for the shared data."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipkie.eval.calibration import calibration, calibration_pairs, reliability_diagram
from pipkie.eval.compare import compare_files, compare_rows, paired_bootstrap
from tests.conftest import require_shared_data

ROOT = Path(__file__).resolve().parents[1]


def rows(right, n: int = 200, keys=("total",), wrong: str = "WRONG") -> list[dict]:
    """n documents with gold 9.00 for each key; the prediction is 9.00 where right(i, key), else `wrong`."""
    return [
        dict(
            id=f"d{i}",
            pred={k: "9.00" if right(i, k) else wrong for k in keys},
            gold={k: ["9.00"] for k in keys},
            confidence={k: 0.5 for k in keys},
        )
        for i in range(n)
    ]


# ---- paired bootstrap ---------------------------------------------------------------------------
def test_bootstrap_interval_matches_the_normal_approximation():
    """A right on all 200 documents, B on every other one: A − B = 0.5, per-document differences
    0 or 1 (sd 0.5), so the 95% interval is about 0.5 ± 1.96 · 0.5 / √200 = 0.5 ± 0.069."""
    r = compare_rows(rows(lambda i, k: True), rows(lambda i, k: i % 2 == 0))
    o = r["overall"]
    assert (o["a"], o["b"], o["diff"], o["p_le_0"]) == (1.0, 0.5, 0.5, 0.0)
    assert o["lo"] == pytest.approx(0.431, abs=0.01) and o["hi"] == pytest.approx(0.569, abs=0.01)
    assert r["n_docs"] == 200 and r["samples"] == 10000


def test_no_difference_gives_an_interval_around_zero():
    """A right on even documents, B on odd ones: A − B is 0 with differences ±1 (sd 1): ±0.139."""
    o = compare_rows(rows(lambda i, k: i % 2 == 0), rows(lambda i, k: i % 2 == 1))["overall"]
    assert o["diff"] == 0.0
    assert o["lo"] == pytest.approx(-0.139, abs=0.012) and o["hi"] == pytest.approx(0.139, abs=0.012)
    assert 0.45 < o["p_le_0"] < 0.6
    same = compare_rows(rows(lambda i, k: i % 3 == 0), rows(lambda i, k: i % 3 == 0))["overall"]
    assert (same["diff"], same["lo"], same["hi"]) == (0.0, 0.0, 0.0)


def test_per_key_and_exact_match_f1():
    """B wrong on half the totals only ('1.00' vs '9.00': ANLS 0.75, not exact)."""
    a = rows(lambda i, k: True, keys=("total", "date"))
    b = rows(lambda i, k: k == "date" or i % 2 == 0, keys=("total", "date"), wrong="1.00")
    anls = compare_rows(a, b)
    assert anls["per_key"]["total"]["diff"] == pytest.approx(0.125)  # (1 − 0.75) / 2
    assert anls["per_key"]["date"] == dict(a=1.0, b=1.0, diff=0.0, lo=0.0, hi=0.0, p_le_0=1.0)
    assert anls["overall"]["diff"] == pytest.approx(0.0625)
    exact = compare_rows(a, b, metric="exact")
    assert exact["per_key"]["total"]["b"] == pytest.approx(0.5)  # TP 100 of 200 predicted, 200 gold
    assert exact["overall"]["b"] == pytest.approx(2 * 300 / 800)  # micro F1 = 2 TP / (pred + gold)
    assert exact["overall"]["diff"] == pytest.approx(0.25)
    assert exact["overall"]["lo"] == pytest.approx(0.215, abs=0.01) and exact["overall"]["hi"] == pytest.approx(
        0.285, abs=0.01
    )


def test_anls_ignoring_whitespace_is_compared_as_anls_is():
    a = [
        dict(id=str(i), pred={"company": "KOREAN RESTAURANT"}, gold={"company": ["KOREANRESTAURANT"]})
        for i in range(50)
    ]
    b = [
        dict(id=str(i), pred={"company": "KOREANRESTAURANT"}, gold={"company": ["KOREANRESTAURANT"]}) for i in range(50)
    ]
    assert compare_rows(a, b)["overall"]["diff"] == pytest.approx(-1 / 17)
    assert compare_rows(a, b, metric="anls-nospace")["overall"]["diff"] == 0.0


def test_item_f1_of_lists():
    """A lists both items of every receipt; B gets the second one's price wrong on even receipts
    and misses it on odd ones: item F1 = 2 TP / (predicted + gold items)."""
    gold = [{"name": "COKE", "price": "1.00"}, {"name": "TEA", "price": "2.00"}]
    a = [dict(id=f"d{i}", pred={"items": gold}, gold={"items": gold}) for i in range(100)]
    b = [
        dict(
            id=f"d{i}",
            pred={"items": gold[:1] + ([{"name": "TEA", "price": "9.99"}] if i % 2 == 0 else [])},
            gold={"items": gold},
        )
        for i in range(100)
    ]
    r = compare_rows(a, b, metric="items")
    assert r["keys"] == ["items"]
    assert r["overall"]["a"] == 1.0
    assert r["overall"]["b"] == pytest.approx(2 * 100 / (150 + 200))  # TP 100, 150 predicted, 200 gold
    assert r["overall"]["lo"] > 0
    with pytest.raises(ValueError, match="items: lists of items; compare them with --metric items"):
        compare_rows(a, b)  # ANLS of a list: a clear error, not a TypeError from the scorer
    flat = [dict(r, pred={**r["pred"], "total": "3.00"}, gold={**r["gold"], "total": ["3.00"]}) for r in a]
    assert compare_rows(flat, flat)["keys"] == ["total"]  # the flat keys beside a list: scored alone


def test_bootstrap_is_seeded():
    rng = random.Random(0)
    gold = "abcdefghij"
    b = [dict(id=str(i), pred={"k": gold[: 10 - rng.randint(0, 4)]}, gold={"k": [gold]}) for i in range(100)]
    a = [dict(id=str(i), pred={"k": gold}, gold={"k": [gold]}) for i in range(100)]
    first, again, other = (compare_rows(a, b, seed=s)["overall"] for s in (0, 0, 1))
    assert first == again and (first["lo"], first["hi"]) != (other["lo"], other["hi"])
    assert first["diff"] == pytest.approx(other["diff"])


def test_only_comparable_files_are_compared():
    a = rows(lambda i, k: True, n=10)
    with pytest.raises(ValueError, match="no document in common"):
        compare_rows(a, [dict(r, id="other" + r["id"]) for r in a])
    with pytest.raises(ValueError, match="different gold values"):
        compare_rows(a, [dict(r, gold={"total": ["1.00"]}) for r in a])
    with pytest.raises(ValueError, match="unknown metric"):
        paired_bootstrap(*[__import__("numpy").ones((3, 1, 2))] * 2, metric="bleu")
    partial = compare_rows(a, a[:6])
    assert (partial["n_docs"], partial["only_a"], partial["only_b"]) == (6, 4, 0)


def test_compare_command(tmp_path):
    for name, right in (("a", lambda i, k: True), ("b", lambda i, k: i % 2 == 0)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(right)))
    from pipkie.cli import app

    res = CliRunner().invoke(
        app,
        [
            "compare",
            str(tmp_path / "a.jsonl"),
            str(tmp_path / "b.jsonl"),
            "--samples",
            "2000",
            "--json",
            str(tmp_path / "c.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "paired bootstrap over 200 documents (2000 resamples, seed 0)" in res.stdout and "+50.00" in res.stdout
    assert json.loads((tmp_path / "c.json").read_text())["overall"]["diff"] == 0.5
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "bad.jsonl")])
    assert res.exit_code == 2 and "bad.jsonl:1: not a predictions row" in res.output and "Traceback" not in res.output


def test_published_sroie_comparison():
    """The shipped PIP model against its AR baseline (forced), all 347 SROIE test receipts: +0.5 ANLS
    is not a difference (the interval spans 0)."""
    r = compare_files(
        ROOT / "results" / "sroie-pip-long-refit.predictions.jsonl",
        ROOT / "results" / "sroie-ar-forced-long.predictions.jsonl",
        samples=4000,
    )
    o = r["overall"]
    assert o["diff"] == pytest.approx(0.0050, abs=0.0001)
    assert -0.0085 < o["lo"] < -0.005 and 0.015 < o["hi"] < 0.0185


# ---- calibration ---------------------------------------------------------------------------------
def test_expected_calibration_error_on_two_bins():
    """10 values at 0.15, all wrong (gap 0.15), and 10 at 0.95, all right (gap 0.05): ECE 0.1."""
    pairs = [(0.15, False)] * 10 + [(0.95, True)] * 10
    cal = calibration(pairs)
    assert cal["ece"] == pytest.approx(0.1) and cal["accuracy"] == 0.5
    assert (cal["high_share"], cal["high_exact"]) == (0.5, 1.0)
    filled = [b for b in cal["bins"] if b["n"]]
    assert [(b["lo"], b["n"], b["accuracy"]) for b in filled] == [
        (pytest.approx(0.1), 10, 0.0),
        (pytest.approx(0.9), 10, 1.0),
    ]


def test_calibration_bin_edges():
    cal = calibration([(1.0, True), (0.9, False), (0.0, True)])
    assert [b["n"] for b in cal["bins"]] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 2]  # 1.0 in the last bin
    assert (cal["high_share"], cal["high_exact"]) == (pytest.approx(2 / 3), 0.5)  # 0.9 counts as ≥ 0.9
    assert calibration([])["ece"] is None


def test_calibration_pairs_skip_unanswered_fields_and_ignore_spaces_and_case():
    r = [
        dict(
            pred={"company": "Choeun Korean Restaurant", "total": None, "date": "12/30/2016"},
            gold={"company": ["CHOEUN KOREANRESTAURANT"], "total": ["$60.44"], "date": ["12/30/2016FRI"]},
            confidence={"company": 0.97, "total": 0.2, "date": 0.91},
        )
    ]
    assert calibration_pairs(r, ["company", "total", "date"]) == [(0.97, True), (0.91, False)]


def test_reliability_diagram_is_a_png(tmp_path):
    from PIL import Image

    out = reliability_diagram(calibration([(0.15, False)] * 3 + [(0.95, True)] * 7), tmp_path / "d" / "r.png", "t")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (600, 600)


# ---- CI and the shared data ------------------------------------------------------------------------
def test_missing_shared_data_fails_under_ci_and_skips_elsewhere(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="CI=true requires it"):
        require_shared_data(tmp_path / "nothing", env={"CI": "true"})
    with pytest.raises(pytest.skip.Exception, match="shared data not found"):
        require_shared_data(tmp_path / "nothing", env={})
    (tmp_path / "data" / "sroie").mkdir(parents=True)
    assert require_shared_data(tmp_path / "data", env={"CI": "true"}) == tmp_path / "data"


def test_a_ci_run_without_shared_data_fails_at_start(tmp_path):
    env = {**os.environ, "CI": "true", "PIPKIE_SHARED_DATA": str(tmp_path / "nothing")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "tests/test_metrics.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "CI=true requires it" in proc.stdout + proc.stderr
