"""Fitting and carrying a confidence calibration (`pipkie.eval.calibration`, `pipkie calibrate`):
the fit recovers a known temperature, a model with a map reports calibrated confidences through
`Extractor` while evaluation rows keep raw ones, no map changes nothing, the CLI writes the map."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.decoding import get_decoder
from pipkie.decoding.results import FieldResult
from pipkie.eval.calibration import (
    calibrate,
    calibration,
    calibration_pairs,
    check_calibration,
    cross_fit,
    document_folds,
    fit_calibration,
    fit_temperature,
    pairs_by_document,
    temperature_nll,
)
from pipkie.eval.store import model_fingerprint
from pipkie.extract import Extractor
from pipkie.io.document import Document, Word
from pipkie.model.modeling import Settings, write_setting
from pipkie.schema import KeySchema
from tests.test_extract import AR_BASELINE, tiny_model_dir  # noqa: F401

runner = CliRunner()
TEXT = "Company Acme Trading\nDate 12/03/2019\nAddress 7 Main Street\nTotal 9.90"


def synthetic(t: float, n: int, seed: int = 0) -> list[tuple[float, bool]]:
    """(raw confidence, right) where a value is right with probability raw ** (1 / t)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = rng.uniform(0.2, 1.0)
        out.append((c, rng.random() < c ** (1 / t)))
    return out


# ---- the fit -----------------------------------------------------------------------------------
@pytest.mark.parametrize("true_t", [0.35, 1.0, 2.5])
def test_fit_recovers_a_known_temperature(true_t):
    pairs = synthetic(true_t, 20000, seed=int(true_t * 100))
    t = fit_temperature(pairs)
    assert t == pytest.approx(true_t, rel=0.06)
    # it is the likelihood's minimum (golden-section search found it, not a bound)
    assert temperature_nll(pairs, t) <= min(temperature_nll(pairs, t * f) for f in (0.9, 0.97, 1.03, 1.1))


def test_calibrated_confidences_are_calibrated_and_keep_the_order():
    pairs = synthetic(0.35, 20000)
    cal = fit_calibration(pairs, fitted_on="synthetic")
    assert cal["method"] == "temperature" and cal["n"] == 20000 and cal["fitted_on"] == "synthetic"
    before, after = calibration(pairs), calibration([(calibrate(c, cal), ok) for c, ok in pairs])
    assert before["ece"] > 0.15 and after["ece"] < 0.03
    assert after["high_exact"] >= 0.9 > before["high_exact"]
    cs = sorted(c for c, _ in pairs)
    assert [calibrate(c, cal) for c in cs] == sorted(calibrate(c, cal) for c in cs)  # monotone
    assert calibrate(1.0, cal) == 1.0 and calibrate(0.0, cal) == 0.0
    assert calibrate(0.7, None) == 0.7  # no map: the raw confidence


def test_fit_needs_values_and_a_stored_one_is_not_infinitely_sure():
    with pytest.raises(ValueError, match="no predicted values"):
        fit_temperature([])
    # a wrong value at a stored 1.0 (rounded) gives a finite fit, below 1: an over-confident model
    assert 0.01 < fit_temperature([(1.0, False)] + [(0.99, True)] * 50) < 1


def test_bad_maps_are_refused(tmp_path):
    for bad in ({"method": "isotonic", "T": 1.0}, {"method": "temperature", "T": 0}, {"method": "temperature"}, [1]):
        with pytest.raises(ValueError, match="confidence_calibration"):
            check_calibration(bad)
    Settings().save(tmp_path)
    with pytest.raises(ValueError, match="confidence_calibration"):
        write_setting(tmp_path, "confidence_calibration", {"method": "temperature", "T": -1})
    raw = json.loads((tmp_path / "pipkie.json").read_text())
    (tmp_path / "pipkie.json").write_text(json.dumps({**raw, "confidence_calibration": {"method": "x", "T": 1}}))
    with pytest.raises(ValueError, match="pipkie.json: confidence_calibration"):
        Settings.load(tmp_path)


def rows_for(t: float, docs: int, seed: int = 0) -> list[dict]:
    """Predictions-file rows of `docs` documents, two keys each, right with probability c ** (1/t)."""
    rng = random.Random(seed)
    rows = []
    for i in range(docs):
        r = dict(id=f"doc{i}", pred={}, gold={}, confidence={})
        for k in ("total", "date"):
            c = round(rng.uniform(0.2, 1.0), 4)
            r["pred"][k], r["confidence"][k] = "9.90", c
            r["gold"][k] = ["9.90"] if rng.random() < c ** (1 / t) else ["1.00"]
        rows.append(r)
    return rows


def test_cross_fit_scores_each_fold_with_a_map_fitted_on_the_others():
    rows = rows_for(0.4, 60)
    by_doc = pairs_by_document(rows, ["total", "date"])
    folds = document_folds(by_doc, 2, seed=3)
    assert set().union(*folds) == set(by_doc) and not folds[0] & folds[1] and len(folds[0]) == 30
    assert document_folds(reversed(list(by_doc)), 2, seed=3) == folds  # not the rows' order
    got = cross_fit(by_doc, 2, seed=3)
    held_out = []
    for i, fold in enumerate(folds):
        rest = [r for r in rows if r["id"] not in fold]
        t = fit_temperature(calibration_pairs(rest, ["total", "date"]))
        assert got["folds"][i]["T"] == pytest.approx(t) and got["folds"][i]["docs"] == 30
        held_out += [(c ** (1 / t), ok) for d in sorted(fold) for c, ok in by_doc[d]]
    assert got["calibrated"] == calibration(held_out)
    assert got["raw"]["n_values"] == 120 and got["calibrated"]["ece"] < got["raw"]["ece"]
    with pytest.raises(ValueError, match="2 folds"):
        cross_fit(by_doc, 1)


# ---- carried by the model ----------------------------------------------------------------------
@pytest.fixture
def mapped(tiny_model_dir, tmp_path):  # noqa: F811
    """Copies of the tiny model and its AR baseline with maps: PIP T = 2.5, AR T = 8 (the random
    model's confidences are near 0: maps that raise them make the change visible)."""
    pip = tmp_path / "pip"
    shutil.copytree(tiny_model_dir, pip)
    shutil.copytree((tiny_model_dir / AR_BASELINE).resolve(), (pip / AR_BASELINE).resolve())
    write_setting(pip, "confidence_calibration", {"method": "temperature", "T": 2.5, "fitted_on": "t", "n": 1})
    write_setting((pip / AR_BASELINE).resolve(), "confidence_calibration", {"method": "temperature", "T": 8.0})
    return pip


def test_without_a_map_confidences_are_the_decoders(tiny_model_dir):  # noqa: F811
    ex = Extractor.from_pretrained(tiny_model_dir)
    assert ex.settings.confidence_calibration is None
    ks = KeySchema.parse("company,date,address,total")
    want = get_decoder("pip")(ex.model, ex.builder, [TEXT], [ks], pattern=ex.settings.pattern)[0]
    got = ex.extract(None, ks, text=TEXT)
    assert {k: (f.value, f.confidence) for k, f in got.fields.items()} == {
        k: (r.value, round(r.confidence, 4)) for k, r in want.items()
    }


def test_a_model_with_a_map_reports_calibrated_confidences(tiny_model_dir, mapped):  # noqa: F811
    raw, cal = Extractor.from_pretrained(tiny_model_dir), Extractor.from_pretrained(mapped)
    assert model_fingerprint(mapped) == model_fingerprint(tiny_model_dir)  # evaluations still resume
    changed = 0
    for decode, t in (("pip", 2.5), ("ar-forced", 8.0)):  # AR decodes: the AR baseline's own map
        for keys in ("company,date:text,address,total:text", "total:text,items[name,price:text]"):  # random values kept
            a = raw.extract(None, keys, decode=decode, text=TEXT).fields
            b = cal.extract(None, keys, decode=decode, text=TEXT).fields
            flat = lambda fs: [  # noqa: E731
                x for f in fs.values() for x in ([y for it in f for y in it.values()] if isinstance(f, list) else [f])
            ]
            assert [f.value for f in flat(a)] == [f.value for f in flat(b)]
            for fa, fb in zip(flat(a), flat(b)):
                if fa.value is None:  # an absent key's confidence is not a value's: left raw
                    assert fb.confidence == fa.confidence
                else:
                    # fa's confidence is rounded to 4 decimals: fb's lies in the image of its interval
                    lo, hi = ((fa.confidence + e) ** (1 / t) for e in (-5e-5, 5e-5))
                    assert lo - 5e-5 <= fb.confidence <= hi + 5e-5
                    changed += fb.confidence > fa.confidence + 0.1
    assert changed >= 10  # (the random AR baseline writes values, item fields included)


def stand_in(answers: dict[str, tuple[str | None, float]]):
    """A pip_decode that answers `answers` (value, confidence) for every document."""

    def decode(model, builder, texts, schemas, **kw):
        return [{k: FieldResult(*answers.get(k, (None, 0.1))) for k in s.names} for s in schemas]

    return decode


def test_evaluation_rows_keep_raw_confidences_and_the_summary_has_both(mapped, tmp_path, monkeypatch):
    from pipkie.data.donut import write_donut
    from pipkie.eval.evaluate import evaluate, format_table

    words = [Word(t, (100 * i, 100, 100 * i + 90, 130)) for i, t in enumerate("Total 9.90 Date 12/03/2019".split())]
    docs = [Document(id=f"d{i}", words=words, fields={"total": ["9.90"], "date": ["12/03/2019"]}) for i in range(3)]
    write_donut(docs, tmp_path / "data" / "test")
    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", stand_in({"total": ("9.90", 0.81), "date": ("1/12", 0.64)}))
    out = tmp_path / "eval.json"
    result = evaluate(
        dataset="donut",
        data_dir=str(tmp_path / "data"),
        model_path=str(mapped),
        keys="total,date",
        json_path=str(out),
        log=lambda m: None,
    )
    rows = [json.loads(line) for line in out.with_suffix(".predictions.jsonl").read_text().splitlines()]
    assert [r["confidence"] for r in rows] == [{"total": 0.81, "date": 0.64}] * 3  # raw: a refit is possible
    assert result["calibration"]["bins"][8]["n"] == 3 and result["calibration"]["bins"][6]["n"] == 3
    assert result["calibrated"]["map"]["T"] == 2.5
    assert result["calibrated"]["bins"][9]["n"] == 3 and result["calibrated"]["bins"][8]["n"] == 3  # .919, .837
    assert "calibration (raw)" in format_table(result) and "calibration (the model's map)" in format_table(result)
    # and what the same model reports to a user is calibrated
    got = Extractor.from_pretrained(mapped).extract(docs[0], "total,date").fields
    assert (got["total"].confidence, got["date"].confidence) == (round(0.81**0.4, 4), round(0.64**0.4, 4))


# ---- the command -------------------------------------------------------------------------------
def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_calibrate_command_fits_reports_and_writes_the_map(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    Settings(keys=["total"], ar_baseline="../ar").save(model)
    before = json.loads((model / "pipkie.json").read_text())
    fit = write_rows(tmp_path / "dev.predictions.jsonl", rows_for(0.4, 80))
    other = write_rows(tmp_path / "other.predictions.jsonl", rows_for(0.4, 20, seed=1))
    args = [str(fit), "--model", str(model), "--cross-fit", "2", "--score", str(other)]

    res = runner.invoke(app, ["calibrate", *args, "--json", str(tmp_path / "cal.json")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "| held out: 2-fold over 80 documents" in res.stdout and "other.predictions.jsonl (total,date" in res.stdout
    assert json.loads((model / "pipkie.json").read_text()) == before  # no --write: the model is untouched
    report = json.loads((tmp_path / "cal.json").read_text())
    want_t = fit_temperature(calibration_pairs(rows_for(0.4, 80), ["total", "date"]))
    assert report["map"]["T"] == pytest.approx(want_t, abs=1e-5) and report["map"]["n"] == 160
    assert report["cross_fit"]["calibrated"]["n_values"] == 160

    res = runner.invoke(app, ["calibrate", *args, "--write"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    after = json.loads((model / "pipkie.json").read_text())
    assert before["confidence_calibration"] is None and after.keys() == before.keys()
    assert {**after, "confidence_calibration": None} == before  # only the map changed
    written = Settings.load(model).confidence_calibration
    assert written["method"] == "temperature" and math.isclose(written["T"], want_t, abs_tol=1e-5)
    assert written["fitted_on"] == "dev.predictions.jsonl (total,date)" and written["n"] == 160


def test_calibrate_command_errors(tmp_path):
    fit = write_rows(tmp_path / "dev.predictions.jsonl", rows_for(0.4, 4))
    res = runner.invoke(app, ["calibrate", str(fit), "--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "error: " in res.stderr and "not a pipkie model directory" in res.stderr
    Settings().save(tmp_path)
    res = runner.invoke(app, ["calibrate", str(fit), "--model", str(tmp_path), "--cross-fit", "1"])
    assert res.exit_code == 2 and "2 folds" in res.stderr
    res = runner.invoke(app, ["calibrate", str(fit), "--model", str(tmp_path), "--cross-fit", "9"])
    assert res.exit_code == 2 and "error: 4 documents cannot make 9 folds" in res.stderr
    empty = write_rows(tmp_path / "empty.predictions.jsonl", [])
    res = runner.invoke(app, ["calibrate", str(empty), "--model", str(tmp_path)])
    assert res.exit_code == 2 and "no predictions" in res.stderr
