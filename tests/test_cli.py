"""`pipkie extract | explain | serve` through typer's CliRunner (stdout and stderr apart), one real
subprocess run (slow), on the tiny random model of test_extract.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from pipkie.cli import app
from tests.test_extract import BOX_FILE, SAMPLE, answering, needs_sroie, tiny_model_dir  # noqa: F401

runner = CliRunner()


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def words_file(tmp_path: Path, name="words.json") -> Path:
    p = tmp_path / name
    p.write_text(
        json.dumps(
            {
                "words": [
                    {"text": "ACME", "box": [100, 50, 300, 80]},
                    {"text": "TOTAL", "box": [100, 800, 200, 820]},
                    {"text": "9.90", "box": [700, 800, 780, 820]},
                ],
                "page_sizes": [[1000, 1000]],
            }
        )
    )
    return p


def test_good_and_bad_files(tiny_model_dir, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    res = run(
        "extract",
        SAMPLE,
        bad,
        tmp_path / "missing.pdf",
        words_file(tmp_path),
        "--model",
        tiny_model_dir,
        "--keys",
        "company,total",
    )
    assert res.exit_code == 1
    out = json_lines(res.stdout)
    assert [d["document"] for d in out] == ["receipt", "words"]  # input order, bad files skipped
    assert all(list(d["fields"]) == ["company", "total"] for d in out)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "broken.png" in errors[0] and "missing.pdf" in errors[1]
    assert "2 of 4 file(s) failed" in res.stderr


def test_pretty_json_schema_file_and_env_model(tiny_model_dir, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"total": {"type": "string"}, "vendor": {"type": "string"}}})
    )
    text = tmp_path / "note.txt"
    text.write_text("Vendor Acme\nTotal 9.90\n")
    res = run("extract", text, "--schema", schema, "--json", env={"PIPKIE_MODEL": str(tiny_model_dir)})
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("{\n  ")  # indented
    d = json.loads(res.stdout)
    assert d["document"] == "note" and list(d["fields"]) == ["total", "vendor"] and d["decode"] == "pip"


@needs_sroie
def test_draw_boxes_on_the_page(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(
        "pipkie.decoding.pip.pip_decode", answering({"company": "PETRODELI ENTERPRISE", "total": "85.54"})
    )
    out = tmp_path / "boxes.png"
    res = run("extract", BOX_FILE, "--model", tiny_model_dir, "--draw", out, "--decode", "pip")
    assert res.exit_code == 0, res.output
    d = json_lines(res.stdout)[0]
    assert d["fields"]["company"]["grounding"] == "exact" and d["fields"]["total"]["boxes"]
    with Image.open(out) as im, Image.open(BOX_FILE.parents[1] / "img" / f"{BOX_FILE.stem}.jpg") as page:
        assert im.size == page.size
    # several files: one picture each, named after the file
    res = run("extract", BOX_FILE, words_file(tmp_path), "--model", tiny_model_dir, "--draw", out)
    assert res.exit_code == 0, res.output
    assert (tmp_path / f"boxes.{BOX_FILE.stem}.png").exists() and (tmp_path / "boxes.words.png").exists()


def test_usage_errors(tiny_model_dir, tmp_path):
    f = words_file(tmp_path)
    res = run("extract", f, "--model", tiny_model_dir, "--decode", "beam")
    assert res.exit_code == 2 and "pip, ar-free, ar-forced" in res.output
    res = run("extract", f, "--model", tiny_model_dir, "--keys", "a,,b")
    assert res.exit_code == 2 and "blank" in res.output
    res = run("extract", f, "--model", tmp_path / "no-model")
    assert res.exit_code == 2 and "model not found" in res.stderr
    res = run("extract", f, env={"PIPKIE_MODEL": str(tmp_path / "nowhere")})
    assert res.exit_code == 2 and "nowhere" in res.stderr


def test_explain_writes_a_heat_map(tiny_model_dir, tmp_path):
    out = tmp_path / "heat.png"
    res = run("explain", words_file(tmp_path), "--key", "total", "--model", tiny_model_dir, "--out", out, "--top", "2")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("total = ") and f"heat map: {out}" in res.stdout
    assert len([line for line in res.stdout.splitlines() if line.startswith("  ")]) == 2
    assert out.exists()
    res = run("explain", words_file(tmp_path), "--key", "total", "--model", tiny_model_dir, "--out", out, "--json")
    d = json.loads(res.stdout)
    assert d["key"] == "total" and {w["text"] for w in d["words"]} == {"ACME", "TOTAL", "9.90"}
    res = run("explain", words_file(tmp_path), "--key", "total", "--keys", "date", "--model", tiny_model_dir)
    assert res.exit_code == 1 and "not among the keys" in res.stderr


def test_serve_starts_uvicorn_with_the_app(tiny_model_dir, monkeypatch):
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: seen.update(app=app_, **kw))
    res = run("serve", "--model", tiny_model_dir, "--port", "8123", "--max-batch", "4")
    assert res.exit_code == 0, res.output
    assert seen["port"] == 8123 and seen["host"] == "127.0.0.1"
    assert {r.path for r in seen["app"].routes} >= {"/health", "/extract", "/docs"}
    assert seen["app"].state.batcher.max_batch == 4


@pytest.mark.slow
def test_subprocess_exit_code_and_streams(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"nothing")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PIPKIE_MODEL": str(tiny_model_dir)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipkie.cli", "extract", str(words_file(tmp_path)), str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1
    assert [d["document"] for d in json_lines(proc.stdout)] == ["words"]
    assert "bad.pdf" in proc.stderr and "Traceback" not in proc.stderr


def test_every_command_is_listed_by_one_sentence_of_its_docstring():
    from pipkie.cli import app as cli_app

    listed = {c.callback.__name__: c.short_help for c in cli_app.registered_commands}
    assert len(listed) >= 14 and all(h and "\n" not in h and h.endswith(".") for h in listed.values()), listed
    assert listed["soup"].startswith("Average the weights of models fine-tuned from one model")
    out = runner.invoke(cli_app, ["--help"], terminal_width=200).output
    assert "label" in out and "Pseudo-labels for self-training" in out
