"""Abstention thresholds (`pipkie.decoding.abstain`, `pipkie.eval.abstention`, `pipkie abstain`):
a value below its key's threshold answers `unknown` and keeps what it read; thresholds are fitted
to maximise ANLS, cross-fitted on held-out folds; a model carries them, `Extractor` applies them,
evaluation rows stay raw and the summary reports both; bad maps are refused."""

from __future__ import annotations

import json
import random
import shutil

import pytest
from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.decoding.abstain import check_abstention, withhold
from pipkie.decoding.results import FieldResult
from pipkie.eval.abstention import GRID, abstain_files, cross_fit, fit_abstention, fit_thresholds, withhold_rows
from pipkie.eval.evaluate import summarize
from pipkie.extract import Extractor
from pipkie.model.modeling import Settings, write_setting
from tests.test_calibration_fit import stand_in
from tests.test_extract import tiny_model_dir  # noqa: F401

runner = CliRunner()


def rows_for(n: int, seed: int = 0) -> list[dict]:
    """Documents where an address is printed in 60%: read right at confidence ~0.9; where it is
    missing the model still copies a wrong line, at ~0.5 (what WildReceipt's address-less receipts
    do). Totals are always there and right, some at low confidence (a threshold there only hurts)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        has = rng.random() < 0.6
        out.append(
            dict(
                id=f"d{i}",
                pred={"address": "7 MAIN ST" if has else "TEL 555-0100", "total": "9.90"},
                confidence={
                    "address": round(rng.uniform(0.8, 1.0) if has else rng.uniform(0.3, 0.6), 4),
                    "total": round(rng.uniform(0.2, 1.0), 4),
                },
                gold={"address": ["7 MAIN ST"] if has else None, "total": ["9.90"]},
            )
        )
    return out


def test_withhold_answers_unknown_below_the_threshold_and_keeps_the_value():
    pred = {"address": FieldResult("TEL 555", 0.5), "total": FieldResult("9.90", 0.2), "date": FieldResult(None, 0.9)}
    out = withhold(pred, {"address": 0.7, "date": 0.95})
    assert out["address"].value is None and out["address"].withheld == "TEL 555" and out["address"].confidence == 0.5
    assert out["total"] == pred["total"]  # no threshold: untouched, however low
    assert out["date"] == pred["date"]  # already unknown
    assert withhold(pred, {}) is pred and withhold(pred, {"address": 0.5})["address"].value == "TEL 555"  # not below


@pytest.mark.parametrize(
    "bad",
    [
        {"thresholds": {"address": 0.5}},  # no method
        {"method": "temperature", "thresholds": {}},
        {"method": "confidence_below", "thresholds": [0.5]},
        {"method": "confidence_below", "thresholds": {"address": 1.5}},
        {"method": "confidence_below", "thresholds": {"address": True}},
        {"method": "confidence_below", "thresholds": {"address": float("nan")}},
        "0.5",
    ],
)
def test_bad_maps_are_refused_on_write_and_on_load(tmp_path, bad):
    with pytest.raises(ValueError, match="abstention"):
        check_abstention(bad)
    Settings().save(tmp_path)
    with pytest.raises(ValueError, match="abstention"):
        write_setting(tmp_path, "abstention", bad)
    data = json.loads((tmp_path / "pipkie.json").read_text())
    assert data["abstention"] is None  # a refused map is not written
    (tmp_path / "pipkie.json").write_text(json.dumps({**data, "abstention": bad}))
    with pytest.raises(ValueError, match="pipkie.json: abstention"):
        Settings.load(tmp_path)


def test_the_fit_withholds_where_it_pays_and_nowhere_else():
    rows = rows_for(200)
    ts = fit_thresholds(rows, ["address", "total"])
    assert set(ts) == {"address"} and 0.6 <= ts["address"] <= 0.8  # the lowest that parts the two ranges
    assert ts["address"] in GRID
    fixed = withhold_rows(rows, ts)
    assert all((r["pred"]["address"] is None) == (r["gold"]["address"] is None) for r in fixed)
    assert all(r["pred"]["total"] == "9.90" for r in fixed)
    assert rows[0]["pred"]["address"] is not None or rows[0]["gold"]["address"] is None  # rows are not changed
    m = fit_abstention(rows, ["address", "total"], fitted_on="dev")
    assert check_abstention(m) is m and m["n"] == 200 and m["fitted_on"] == "dev"


def test_cross_fitting_scores_every_document_with_thresholds_fitted_elsewhere():
    rows = rows_for(60)
    crossed = cross_fit(rows, ["address", "total"], folds=3)
    assert sorted(r["id"] for r in crossed) == sorted(r["id"] for r in rows)
    with pytest.raises(ValueError, match="cannot make 61 folds"):
        cross_fit(rows, ["address"], folds=61)


def test_abstain_files_reports_the_fitted_and_the_cross_fitted_gain(tmp_path):
    path = tmp_path / "dev.predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_for(120)))
    r = abstain_files([path])
    assert r["keys"] == ["address", "total"] and set(r["map"]["thresholds"]) == {"address"}
    assert r["fitted"]["overall"]["diff"] > 0.15  # ~40% of addresses were wrong copies: now right
    assert r["cross_fitted"]["overall"]["lo"] > 0.1  # and it holds on documents it was not fitted on


def test_abstain_command_fits_reports_and_writes(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    Settings(keys=["address", "total"]).save(model)
    before = json.loads((model / "pipkie.json").read_text())
    fit = tmp_path / "dev.predictions.jsonl"
    fit.write_text("".join(json.dumps(r) + "\n" for r in rows_for(80)))
    res = runner.invoke(app, ["abstain", str(fit), "--model", str(model), "--json", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    assert "address below 0." in res.stdout and "cross-fitted (5 folds" in res.stdout
    assert json.loads((model / "pipkie.json").read_text()) == before  # no --write: untouched
    res = runner.invoke(app, ["abstain", str(fit), "--model", str(model), "--write", "--folds", "4"])
    assert res.exit_code == 0, res.output
    written = Settings.load(model).abstention
    assert set(written["thresholds"]) == {"address"} and written["fitted_on"] == "dev.predictions.jsonl (address,total)"
    assert {**json.loads((model / "pipkie.json").read_text()), "abstention": None} == before  # only that changed
    res = runner.invoke(app, ["abstain", str(tmp_path / "none.jsonl"), "--model", str(model)])
    assert res.exit_code == 2
    res = runner.invoke(app, ["abstain", str(fit), "--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "not a pipkie model directory" in res.stderr


def test_the_summary_reports_raw_and_abstained_scores():
    rows = rows_for(100)
    m = fit_abstention(rows, ["address", "total"])
    out = summarize(rows, ["address", "total"], abstention=m)
    assert out["abstained"]["anls"] > out["anls"] + 0.15 and out["abstained"]["map"] is m
    assert "abstained" not in summarize(rows, ["address", "total"])


def test_a_model_with_thresholds_withholds_through_extractor(tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    write_setting(model, "abstention", {"method": "confidence_below", "thresholds": {"address": 0.7}})
    monkeypatch.setattr(
        "pipkie.decoding.pip.pip_decode", stand_in({"address": ("TEL 555", 0.5), "total": ("9.9", 0.3)})
    )
    ex = Extractor.from_pretrained(model)
    result = ex.extract(None, "address,total", text="Address TEL 555\nTotal 9.9")
    got = result.fields
    d = result.to_dict()["fields"]  # (JSON: `withheld` only where something was)
    assert d["address"]["withheld"] == "TEL 555" and d["address"]["value"] is None and "withheld" not in d["total"]
    assert got["address"].value is None and got["address"].withheld == "TEL 555"
    assert got["total"].value == "9.9"  # no threshold for it
    raw = ex.extract(None, "address,total", text="Address TEL 555\nTotal 9.9", abstain=False).fields
    assert raw["address"].value == "TEL 555" and raw["address"].withheld is None
    assert (
        Extractor.from_pretrained(tiny_model_dir)
        .extract(None, "address", text="Address TEL 555")
        .fields["address"]
        .value
        == "TEL 555"
    )  # no map, nothing withheld
