"""`pipkie evaluate` end to end on tiny random models: resuming only under the same settings, key
maps and the missing-gold warning, OCR'd words from a cache, truncation, calibration, the CLI.

Decoding is counted by wrapping `pipkie.eval.evaluate.decode_batch`, so "nothing reused" is checked
as "every document decoded again", not inferred from scores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipkie.decoding.results import FieldResult
from pipkie.eval import evaluate as ev
from pipkie.eval.store import model_fingerprint
from pipkie.io.document import Document, Word
from pipkie.schema import Key, KeySchema
from tests.test_extract import build_tiny_model

WILD = "wildreceipt_dev"
SROIE_MAP = "company=store_name,address=store_addr"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny models that differ only in their random weights, and a byte-identical copy of the first."""
    root = tmp_path_factory.mktemp("eval-models")
    a, b = build_tiny_model(root / "a", seed=0), build_tiny_model(root / "b", seed=1)
    shutil.copytree(a, root / "a-copy")
    return dict(a=a, b=b, a_copy=root / "a-copy")


@pytest.fixture
def decoded(monkeypatch):
    """Texts handed to the decoder, one list per batch."""
    calls: list[list[str]] = []
    real = ev.decode_batch

    def counting(model, builder, texts, *a, **kw):
        calls.append(list(texts))
        return real(model, builder, texts, *a, **kw)

    monkeypatch.setattr(ev, "decode_batch", counting)
    return calls


def n_decoded(calls) -> int:
    return sum(len(c) for c in calls)


def run_sroie(shared_data, tmp_path, model, log=None, **kw):
    args = dict(
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        split="test",
        model_path=str(model),
        limit=2,
        json_path=str(tmp_path / "out.json"),
        log=log.append if log is not None else (lambda m: None),
    )
    return ev.evaluate(**{**args, **kw})


def test_model_fingerprint_follows_the_files_not_the_path(models, tmp_path):
    a = model_fingerprint(models["a"])
    assert a == model_fingerprint(models["a_copy"]) and a != model_fingerprint(models["b"])
    changed = Path(shutil.copytree(models["a"], tmp_path / "m"))
    settings = json.loads((changed / "pipkie.json").read_text())
    (changed / "pipkie.json").write_text(json.dumps({**settings, "default_budget": 17}))
    assert model_fingerprint(changed) != a
    assert model_fingerprint("smollm2") == "name:smollm2"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no model files"):
        model_fingerprint(tmp_path / "empty")


def test_resumes_only_under_the_same_settings(models, shared_data, tmp_path, decoded):
    log: list[str] = []
    first = run_sroie(shared_data, tmp_path, models["a"], log)
    assert n_decoded(decoded) == 2
    same = run_sroie(shared_data, tmp_path, models["a_copy"], log)  # same bytes elsewhere: same model
    assert n_decoded(decoded) == 2 and same["anls"] == first["anls"]
    assert any("resuming" in m for m in log)

    changes = [
        (dict(keys=["company", "total"]), "keys"),
        (dict(keys=KeySchema((Key("company"), Key("total", "the amount paid")))), "keys"),  # a description
        (dict(keys=KeySchema((Key("company"), Key("total", "the amount paid", max_tokens=3)))), "keys"),  # a budget
        (dict(model=models["b"]), "model"),
        (dict(model=models["b"], refine_steps=1), "refine_steps"),
        (dict(model=models["b"], limit=1), "limit"),
    ]
    for i, (change, named) in enumerate(changes):
        log.clear()
        model = change.pop("model", models["a"])
        result = run_sroie(shared_data, tmp_path, model, log, **change)
        expected = 2 * (i + 2) - (1 if "limit" in change else 0)
        assert n_decoded(decoded) == expected, change
        assert any("not resuming" in m and named in m for m in log), (change, log)
        rows = [json.loads(x) for x in (tmp_path / "out.predictions.jsonl").read_text().splitlines()]
        assert len(rows) == result["n_docs"] and {r["run"] for r in rows} == {result["fingerprint"]["hash"]}
    assert (tmp_path / "out.predictions.previous.jsonl").is_file()  # the replaced run is kept aside

    before = n_decoded(decoded)
    run_sroie(shared_data, tmp_path, models["b"], log, limit=1)
    assert n_decoded(decoded) == before  # unchanged settings again: resumed
    run_sroie(shared_data, tmp_path, models["b"], log, limit=1, fresh=True)
    assert n_decoded(decoded) == before + 1


def test_predictions_without_a_fingerprint_are_not_reused(models, shared_data, tmp_path, decoded):
    """The committed results/sroie-pip.predictions.jsonl (an older model, no fingerprint) is what
    made `scripts/eval_sroie.sh pip` print 84.3 for the shipped model."""
    stale = Path(__file__).resolve().parents[1] / "results" / "sroie-pip.predictions.jsonl"
    (tmp_path / "out.predictions.jsonl").write_text("".join(stale.read_text().splitlines(True)[:2]))
    log: list[str] = []
    run_sroie(shared_data, tmp_path, models["a"], log)
    assert n_decoded(decoded) == 2
    assert any("without a record of their settings" in m for m in log)


def test_a_decoder_has_one_name(models, shared_data, tmp_path, decoded):
    for name in ("beam", "ar"):  # (`ar` was once the CLI's name for ar-free: one name now)
        with pytest.raises(ValueError, match="pip, ar-free, ar-forced"):
            run_sroie(shared_data, tmp_path, models["a"], decode=name, limit=1)
    first = run_sroie(shared_data, tmp_path, models["a"], decode="ar-free", limit=1)
    assert first["decode"] == first["fingerprint"]["decode"] == "ar-free"
    run_sroie(shared_data, tmp_path, models["a"], decode="ar-free", limit=1)
    assert n_decoded(decoded) == 1  # the same decoder: resumed


def test_key_map_reads_gold_from_the_datasets_class_and_warns_on_missing_gold(models, shared_data, tmp_path):
    from pipkie.data import read_dataset

    docs = list(read_dataset("wildreceipt", shared_data / WILD, "dev", limit=3))
    kw = dict(
        dataset="wildreceipt",
        data_dir=str(shared_data / WILD),
        split="dev",
        model_path=str(models["a"]),
        limit=3,
        keys=["company", "date", "address", "total"],
        log=lambda m: None,
    )
    mapped = ev.evaluate(**kw, key_map=SROIE_MAP, json_path=str(tmp_path / "mapped.json"))
    rows = [json.loads(x) for x in (tmp_path / "mapped.predictions.jsonl").read_text().splitlines()]
    assert [r["gold"]["company"] for r in rows] == [d.fields["store_name"] for d in docs]
    assert [r["gold"]["address"] for r in rows] == [d.fields["store_addr"] for d in docs]
    assert mapped["warnings"] == [] and mapped["key_map"] == {"company": "store_name", "address": "store_addr"}

    plain = ev.evaluate(**kw, json_path=str(tmp_path / "plain.json"))
    assert len(plain["warnings"]) == 2
    assert "'company'" in plain["warnings"][0] and "--key-map company=" in plain["warnings"][0]
    assert "'address'" in plain["warnings"][1] and "store_addr" in plain["warnings"][1]
    assert json.loads((tmp_path / "plain.json").read_text())["warnings"] == plain["warnings"]


@pytest.mark.parametrize(
    "spec,message", [("company", "not KEY=GOLD_KEY"), ("company=", "not KEY=GOLD_KEY"), ("a=x,a=y", "mapped twice")]
)
def test_bad_key_maps_are_refused(spec, message):
    from pipkie.eval.gold import parse_key_map

    with pytest.raises(ValueError, match=message):
        parse_key_map(spec)


@pytest.fixture
def fake_ocr(monkeypatch):
    """`pipkie.io.ocr_folder` OCRs with this stand-in: every image reads "HELLO / 9.99"."""
    calls: list[str] = []

    def load(path, **kw):
        calls.append(str(path))
        return Document(
            id="x", words=[Word("HELLO", (10, 10, 300, 40)), Word("9.99", (10, 60, 200, 90))], page_sizes=[(500, 800)]
        )

    monkeypatch.setattr("pipkie.io.ocr_folder.load_document", load)
    return calls


def test_ocr_replaces_the_datasets_words_and_is_cached(models, shared_data, tmp_path, fake_ocr, decoded):
    kw = dict(
        dataset="wildreceipt",
        data_dir=str(shared_data / WILD),
        split="dev",
        model_path=str(models["a"]),
        limit=2,
        key_map=SROIE_MAP,
        ocr="rapidocr",
        json_path=str(tmp_path / "ocr.json"),
        log=lambda m: None,
    )
    result = ev.evaluate(**kw)
    assert len(fake_ocr) == 2 and decoded == [["HELLO\n9.99"] * 2]
    cached = sorted((tmp_path / "ocr-cache" / f"rapidocr-{WILD}").rglob("*.jpeg.json"))
    assert len(cached) == 2 and result["ocr"] == "rapidocr"
    rows = [json.loads(x) for x in (tmp_path / "ocr.predictions.jsonl").read_text().splitlines()]
    assert rows[0]["gold"]["company"] == ["CHOEUN KOREANRESTAURANT"]  # gold stays the dataset's
    ev.evaluate(**kw, fresh=True)
    assert len(fake_ocr) == 2 and n_decoded(decoded) == 4  # decoded again, OCR'd from the cache
    log: list[str] = []
    ev.evaluate(**{**kw, "ocr": None, "log": log.append})  # the dataset's words: not the same run
    assert any("not resuming" in m and "ocr" in m for m in log)


@pytest.mark.parametrize("folder", ["", "image_files"])
def test_a_folder_ocrd_by_pipkie_ocr_serves_as_the_cache(models, shared_data, tmp_path, fake_ocr, decoded, folder):
    from pipkie.io.ocr_folder import ocr_folder

    ocr_folder(shared_data / WILD / folder, tmp_path / "words", progress=False)  # `pipkie ocr DIR --out words`
    assert len(fake_ocr) == 100
    ev.evaluate(
        dataset="wildreceipt",
        data_dir=str(shared_data / WILD),
        split="dev",
        model_path=str(models["a"]),
        limit=3,
        ocr="rapidocr",
        ocr_cache=str(tmp_path / "words"),
        log=lambda m: None,
    )
    assert len(fake_ocr) == 100 and decoded == [["HELLO\n9.99"] * 3]


def test_documents_cut_to_fit_the_context_are_flagged(models, shared_data, tmp_path):
    from pipkie.data import read_dataset
    from pipkie.io.document import serialize
    from pipkie.model.modeling import builder_for, load_model

    short = Path(shutil.copytree(models["a"], tmp_path / "short"))
    settings = json.loads((short / "pipkie.json").read_text())
    (short / "pipkie.json").write_text(json.dumps({**settings, "max_length": 256}))
    fits = run_sroie(shared_data, tmp_path / "fits", models["a"])
    cut = run_sroie(shared_data, tmp_path / "cut", short)
    assert (fits["truncated_docs"], cut["truncated_docs"], cut["truncated_ids"]) == (
        0,
        2,
        ["X00016469670", "X00016469671"],
    )
    _, tok, s = load_model(models["a"])
    builder = builder_for(tok, s)
    docs = list(read_dataset("sroie", shared_data / "sroie", "test", limit=2))
    rows = [json.loads(x) for x in (tmp_path / "cut" / "out.predictions.jsonl").read_text().splitlines()]
    for d, r in zip(docs, rows):  # at most 256 tokens fit, so at least the rest was cut
        assert r["truncated"] >= len(builder.document_ids(serialize(d))) - 256 > 0
    assert "truncated to fit the context: 2 of 2 documents" in ev.format_table(cut)


def test_calibration_of_stored_confidences_and_the_reliability_diagram(models, shared_data, tmp_path, monkeypatch):
    """Receipts X00016469670 and X00016469671 have totals 193.00 and 170.00: answering 193.00 at 0.95
    is right once, a wrong company at 0.92 never; date and address unanswered (not counted)."""

    def answer(model, builder, texts, schemas, **kw):
        values = {"total": ("193.00", 0.95), "company": ("WRONG SDN BHD", 0.92)}
        return [{k: FieldResult(*values.get(k, (None, 0.3))) for k in s.names} for s in schemas]

    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", answer)
    png = tmp_path / "reliability.png"
    result = run_sroie(shared_data, tmp_path, models["a"], reliability=str(png))
    cal = result["calibration"]
    assert (cal["n_values"], cal["high_share"], cal["high_exact"]) == (4, 1.0, 0.25)
    assert cal["ece"] == pytest.approx(abs(0.25 - (0.95 + 0.92) / 2))
    rows = [json.loads(x) for x in (tmp_path / "out.predictions.jsonl").read_text().splitlines()]
    assert rows[0]["confidence"] == {"company": 0.92, "date": 0.3, "address": 0.3, "total": 0.95}
    from PIL import Image

    assert Image.open(png).size[0] >= 400 and result["reliability"] == str(png)
    assert "ECE 0.685 over 4 values; 100.0% have confidence ≥ 0.9, 25.0% of those exact" in ev.format_table(result)


# ---- the command line -------------------------------------------------------------------------------
def cli(*args):
    from pipkie.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_cli_wildreceipt_with_a_key_map(models, shared_data, tmp_path):
    out = tmp_path / "wild.json"
    res = cli(
        "evaluate",
        "--dataset",
        "wildreceipt",
        "--data-dir",
        shared_data / WILD,
        "--split",
        "dev",
        "--keys",
        "company,date,address,total",
        "--key-map",
        SROIE_MAP,
        "--model",
        models["a"],
        "--limit",
        2,
        "--json",
        out,
    )
    assert res.exit_code == 0, res.output
    assert "wildreceipt dev · decode=pip · 2 docs" in res.stdout and "warning" not in res.output
    assert json.loads(out.read_text())["per_key"]["company"]["n"] == 2


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--key-map", "company"], "error: --key-map: 'company' is not KEY=GOLD_KEY"),
        (["--decode", "beam"], "error: unknown decode 'beam'"),
        (["--ocr", "rapidocr"], "have no image to OCR"),  # SROIE test ships no images
        (["--data-dir", "/nonexistent/sroie"], "error: "),
    ],
)
def test_cli_bad_input_is_one_clear_line(models, shared_data, extra, message):
    args = ["evaluate", "--dataset", "sroie", "--data-dir", shared_data / "sroie", "--model", models["a"], "--limit", 1]
    res = cli(*args, *extra)
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_ar_decodes_run_the_ar_baseline_never_the_pip_weights(shared_data, tmp_path, decoded):
    from pipkie.model.modeling import NoARBaseline

    pip = build_tiny_model(tmp_path / "pip", seed=3)  # with its tiny AR baseline beside it
    res = run_sroie(shared_data, tmp_path, pip, decode="ar-forced", limit=1)
    baseline = str((pip / json.loads((pip / "pipkie.json").read_text())["ar_baseline"]).resolve())
    assert res["model"] == baseline and n_decoded(decoded) == 1
    lone = build_tiny_model(tmp_path / "lone", seed=4, ar_baseline=None)
    with pytest.raises(NoARBaseline, match="no AR baseline"):
        run_sroie(shared_data, tmp_path / "x", lone, decode="ar-free")
