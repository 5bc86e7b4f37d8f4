"""`pipkie ocr`: a folder of images becomes JSON-words files, resumably, with per-file errors."""

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.data import read_dataset
from pipkie.io.loaders import load_document
from pipkie.io.ocr_folder import list_inputs, ocr_folder

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "receipt.jpg"


def test_ocr_a_folder_resume_and_errors(tmp_path):
    src = tmp_path / "in"
    (src / "a").mkdir(parents=True)
    shutil.copy(SAMPLE, src / "a" / "r1.jpg")
    (src / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (src / "notes.txt").write_text("ignored: not an image")
    assert [p.name for p in list_inputs(src)] == ["r1.jpg", "broken.png"]
    out = tmp_path / "out"
    stats = ocr_folder(src, out, progress=False)
    assert (stats["done"], stats["failed"], stats["skipped"]) == (1, 1, 0)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert errors[0]["path"].endswith("broken.png") and "broken.png" in errors[0]["error"]
    words_file = out / "a" / "r1.jpg.json"
    record = json.loads(words_file.read_text())
    assert record["id"] == "a_r1" and record["normalized"] and len(record["words"]) > 50
    assert any("85.54" in w["text"] for w in record["words"])  # the sample's total
    # the output loads back: as a document, and as the `words` dataset
    doc = load_document(words_file)
    assert [w.text for w in doc.words] == [w["text"] for w in record["words"]]
    (listed,) = read_dataset("words", out, "all")
    assert listed.id == "a_r1" and listed.words == doc.words
    before = words_file.stat().st_mtime_ns
    again = ocr_folder(src, out, progress=False)  # resume: the done file is skipped, the broken one retried
    assert (again["done"], again["skipped"], again["failed"]) == (0, 1, 1)
    assert words_file.stat().st_mtime_ns == before


def _said(res) -> str:
    return " ".join(res.output.replace("│", " ").split())


def test_cli_ocr_shards_and_bad_arguments(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["ocr", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "no such file or folder" in _said(res)
    src = tmp_path / "in"
    src.mkdir()
    res = runner.invoke(app, ["ocr", str(src), "--out", str(tmp_path / "o"), "--shard", "2/2"])
    assert res.exit_code != 0 and "shard must be (i, n)" in _said(res)
    res = runner.invoke(app, ["ocr", str(src), "--out", str(tmp_path / "o"), "--shard", "a/b"])
    assert res.exit_code != 0 and "expected I/N, got 'a/b'" in _said(res)
    res = runner.invoke(app, ["ocr", str(src), "--out", str(tmp_path / "o"), "--shard", "1/2"])
    stats = json.loads(res.output[res.output.index("{") :].splitlines()[0])  # after the progress bar (stderr)
    assert res.exit_code == 0 and (stats["done"], stats["skipped"], stats["failed"]) == (0, 0, 0)


def test_cli_ocr_min_score(tmp_path, monkeypatch):
    from pipkie.io import ocr

    monkeypatch.setattr(ocr, "_OPTIONS", {})  # the option is process-wide: keep it out of other tests
    runner = CliRunner()
    src = tmp_path / "in"
    src.mkdir()
    out = ["--out", str(tmp_path / "o")]
    res = runner.invoke(app, ["ocr", str(src), *out, "--min-score", "1.5"])
    assert res.exit_code != 0 and "must lie in [0, 1], got 1.5" in _said(res)
    res = runner.invoke(app, ["ocr", str(src), *out, "--engine", "tesseract", "--min-score", "0.5"])
    assert res.exit_code != 0 and "only rapidocr takes a line-score threshold" in _said(res)
    assert ocr._OPTIONS == {}
    res = runner.invoke(app, ["ocr", str(src), *out, "--min-score", "0.5"])
    assert res.exit_code == 0 and ocr._OPTIONS == {"rapidocr": {"min_score": 0.5}}
    assert ocr.get_engine("rapidocr", threads=1).min_score == 0.5
    ocr._cached_engine.cache_clear()  # the engine made with the option is not handed to later tests
