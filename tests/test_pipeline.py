"""pipkie.pipeline: many files, pipelined OCR, length batching, resume and error rows, on the tiny
random model of test_extract.py and a folder of text / JSON-words documents written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipkie.pipeline import done_files, expand_inputs, extract_files, length_batches
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401

LINES = [
    "Total 9.90",
    "Company Acme Trading Sdn Bhd",
    "Date 12/03/2019",
    "Address 7 Main Street Kuala Lumpur",
    "TOTAL RM 85.54 VISA GST",
    "INVOICE NUMBER 12 THANK YOU PLEASE COME AGAIN",
]


def make_folder(root: Path, n: int = 7) -> Path:
    """n documents of different lengths: text files and JSON-words files, one in a sub-folder."""
    folder = root / "docs"
    (folder / "sub").mkdir(parents=True)
    for i in range(n):
        lines = [LINES[(i + j) % len(LINES)] for j in range(1 + i % 4)]
        if i % 2:
            words = [
                {"text": w, "box": [40 * k, 30 * row, 40 * k + 35, 30 * row + 20]}
                for row, line in enumerate(lines)
                for k, w in enumerate(line.split())
            ]
            (folder / f"d{i}.json").write_text(json.dumps({"words": words}))
        else:
            (folder / ("sub" if i == 4 else ".") / f"d{i}.txt").write_text("\n".join(lines) + "\n")
    return folder


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "seconds"}


def run(ex, files, **kw) -> list:
    return list(extract_files(ex, files, batch_size=2, window=4, progress=False, **kw))


def test_inputs_expand_folders_and_globs_and_keep_plain_paths(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "notes.md").write_text("not a document type")
    found = expand_inputs([folder])
    assert found == sorted(found) and len(found) == 7 and folder / "sub" / "d4.txt" in found
    assert expand_inputs([str(folder / "*.json")]) == sorted(folder.glob("*.json"))
    assert expand_inputs([str(folder / "**" / "*.txt")]) == sorted(folder.rglob("*.txt"))
    assert expand_inputs([tmp_path / "missing.pdf"]) == [tmp_path / "missing.pdf"]  # reported later, not dropped


def test_length_batches_group_similar_lengths_deterministically():
    lengths = [50, 5, 48, 6, 200, 7]
    assert length_batches(lengths, 2) == [[1, 3], [5, 2], [0, 4]]
    assert length_batches(lengths, 3, max_batch_tokens=150) == [[1, 3, 5], [2, 0], [4]]
    assert length_batches([], 4) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_pipelined_and_serial_runs_write_the_same_json(tiny_extractor, tmp_path, workers):
    files = expand_inputs([make_folder(tmp_path)])
    run(tiny_extractor, files, out=tmp_path / "serial.jsonl", workers=0)
    run(tiny_extractor, files, out=tmp_path / "piped.jsonl", workers=workers)
    serial, piped = rows(tmp_path / "serial.jsonl"), rows(tmp_path / "piped.jsonl")
    assert [r["file"] for r in serial] == [str(f) for f in files]  # input order
    assert [without_time(r) for r in piped] == [without_time(r) for r in serial]
    assert all(list(r["fields"]) == ["company", "date", "address", "total"] for r in serial)


def test_resume_skips_files_already_written_and_repairs_a_cut_row(tiny_extractor, tmp_path):
    files = expand_inputs([make_folder(tmp_path)])
    out = tmp_path / "results.jsonl"
    first = run(tiny_extractor, files[:3], out=out)
    assert [o.file for o in first] == files[:3]
    with open(out, "a") as f:
        f.write('{"file": "' + str(files[3]) + '", "fiel')  # a run killed mid-row
    assert done_files(out) == {str(f) for f in files[:3]}
    second = run(tiny_extractor, files, out=out)
    assert [o.file for o in second] == files[3:]
    assert sorted(r["file"] for r in rows(out)) == sorted(str(f) for f in files)  # one row per file
    assert run(tiny_extractor, files, out=out) == []


def test_a_corrupt_file_gives_an_error_row_and_the_rest_are_processed(tiny_extractor, tmp_path):
    folder = make_folder(tmp_path, n=4)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    files = expand_inputs([folder]) + [tmp_path / "missing.pdf"]
    out = tmp_path / "results.jsonl"
    outcomes = run(tiny_extractor, files, out=out, workers=1)
    written = {r["file"]: r for r in rows(out)}
    assert set(written) == {str(f) for f in files}
    bad = {str(folder / "broken.png"), str(tmp_path / "missing.pdf")}
    for f in bad:
        assert written[f]["error"] and written[f]["code"] and "fields" not in written[f]
    assert all("fields" in r for f, r in written.items() if f not in bad)
    assert sum(o.error is not None for o in outcomes) == 2


def test_a_batch_that_fails_is_retried_one_document_at_a_time(tiny_extractor, tmp_path, monkeypatch):
    files = expand_inputs([make_folder(tmp_path, n=4)])
    real = tiny_extractor.extract_many

    def fragile(docs, *a, **kw):  # any batch holding d2 fails, as if d2 broke the model
        if any(d.id == "d2" for d in docs):
            raise RuntimeError("boom")
        return real(docs, *a, **kw)

    monkeypatch.setattr(tiny_extractor, "extract_many", fragile)
    outcomes = run(tiny_extractor, files)
    assert [o.file.stem for o in outcomes if o.error] == ["d2"] and "boom" in outcomes[2].error
    assert sum(o.result is not None for o in outcomes) == 3


def test_cli_extract_folder_to_out_and_resume(tiny_model_dir, tmp_path):
    from pipkie.cli import app

    folder = make_folder(tmp_path, n=3)
    out = tmp_path / "results.jsonl"
    args = ["extract", str(folder), "--model", str(tiny_model_dir), "--keys", "company,total", "--out", str(out)]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert res.stdout == "" and len(rows(out)) == 3
    assert all(list(r["fields"]) == ["company", "total"] for r in rows(out))
    (folder / "d9.txt").write_text("Total 1.00\n")
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0 and "3 of 4 file(s) already in" in res.stderr and len(rows(out)) == 4


def test_cli_without_out_still_prints_json_lines(tiny_model_dir, tmp_path):
    from pipkie.cli import app

    folder = make_folder(tmp_path, n=3)
    res = CliRunner().invoke(
        app,
        ["extract", str(folder / "*.txt"), str(folder / "d1.json"), "--model", str(tiny_model_dir), "--workers", "1"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    printed = [json.loads(line) for line in res.stdout.splitlines()]
    assert [d["document"] for d in printed] == ["d0", "d2", "d1"] and "file" not in printed[0]


def test_loading_processes_run_below_the_models_priority(tmp_path):
    import os

    from pipkie.pipeline import WORKER_NICE, _Loader

    loader = _Loader([tmp_path / "a.txt"], 1, ("rapidocr", 1, 10), None)
    try:
        assert loader.pool.submit(os.nice, 0).result(timeout=120) == min(os.nice(0) + WORKER_NICE, 19)
    finally:
        loader.pool.shutdown()
