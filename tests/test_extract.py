"""The user-facing Extractor and explain(), on a tiny random pipkie model built here.

The model's answers are random (mostly `unknown`), so the tests check what does not depend on
accuracy: every key answered, boxes on the page (0-1) and only for grounded values, batching that
changes nothing, truncation reported, attention weights that form a distribution over the words.
Grounding is tested deterministically by swapping in a decoder that answers values from the page.

`tiny_model_dir`, `tiny_extractor`, `receipt_doc` and `SAMPLE` are shared with test_cli.py and
test_serve.py (imported from here; the model and the OCR'd receipt are built once per session).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from pipkie.decoding.results import FieldResult
from pipkie.io.document import Document, Word, serialize
from pipkie.schema import KeySchema

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "receipt.jpg"  # SROIE train X51005447832, bundled
SROIE = ROOT.parent / "shared" / "data" / "sroie" / "train"
KLEISTER = ROOT.parent / "shared" / "data" / "kleister_nda"
BOX_FILE = SROIE / "box" / "X51005447832.txt"
needs_sroie = pytest.mark.skipif(not BOX_FILE.exists(), reason="SROIE data not present")
KEYS = ["company", "date", "address", "total"]
BUDGETS = {"company": 8, "date": 6, "address": 12, "total": 5}

TOKENIZER_TEXT = [
    "PETRODELI ENTERPRISE COMPANY NO: SA0127959-D LOT 485, TMN LEMBAH KERAMAT JLN ULU KELANG 54200 KUALA LUMPUR",
    "TOTAL RM 85.54 VISA GST 26/02/18 08:28 INVOICE NUMBER THANK YOU PLEASE COME AGAIN SDN BHD JALAN TAMAN",
    "Total 9.90 Date 12/03/2019 Company Acme Trading Address 7 Main Street company date address total unknown : \n",
]


AR_BASELINE = "../pipkie-tiny-ar"


def build_tiny_model(
    directory: Path,
    seed: int = 0,
    *,
    objective: str = "pip",
    ar_baseline: str | None = AR_BASELINE,
    copy_head: bool = False,
) -> Path:
    """A random 2-layer qwen2 pipkie model directory (tokenizer, weights, pipkie.json): ~1 s on a CPU.
    A PIP model gets a tiny AR model of its own beside it as its `ar_baseline` (None: no baseline);
    `copy_head`: with a (random) copy head, slot tokens and field blocks, like the shipped model."""
    from transformers import AutoModelForCausalLM

    from pipkie.model.copyhead import CopyHead
    from pipkie.model.modeling import Settings, add_tokens_to_model, compact_config
    from pipkie.model.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    directory = Path(directory)
    if (directory / "pipkie.json").exists():
        return directory
    slots = 12 if copy_head else 0
    tok = train_tokenizer(TOKENIZER_TEXT * 4, vocab_size=500, special=list(SPECIAL_TOKENS))
    torch.manual_seed(seed)
    cfg = compact_config(len(tok), "qwen2", hidden=64, layers=2, heads=4, ffn=128, max_positions=1024)
    model = AutoModelForCausalLM.from_config(cfg)
    add_tokens_to_model(model, tok, slots)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    pip = objective == "pip"
    Settings(
        objective=objective,
        keys=KEYS,
        budgets=BUDGETS,
        max_length=1024,
        slot_tokens=slots,
        field_blocks=copy_head,
        copy_head=copy_head,
        ar_baseline=ar_baseline if pip else None,
    ).save(directory)
    if copy_head:
        CopyHead(cfg.hidden_size, dim=16).save(directory)
    if pip and ar_baseline:
        build_tiny_model((directory / ar_baseline).resolve(), seed + 1, objective="ar")
    return directory


@functools.cache
def load_tiny_extractor(path: str):
    from pipkie.extract import Extractor

    return Extractor.from_pretrained(path)


@functools.cache
def ocr_receipt() -> Document:
    from pipkie.io.loaders import load_document

    return load_document(SAMPLE)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    # one directory per session even when this fixture is imported into several test modules
    return build_tiny_model(tmp_path_factory.getbasetemp() / "pipkie-tiny-model")


@pytest.fixture(scope="session")
def tiny_extractor(tiny_model_dir):
    return load_tiny_extractor(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_copy_extractor(tmp_path_factory):
    """A tiny model with a random copy head (its answers are random, its decoding path the shipped one's)."""
    return load_tiny_extractor(
        str(build_tiny_model(tmp_path_factory.getbasetemp() / "pipkie-tiny-copy", 2, copy_head=True, ar_baseline=None))
    )


@pytest.fixture(scope="session")
def receipt_doc() -> Document:
    """The bundled receipt, OCR'd once (rapidocr, ~3 s)."""
    return ocr_receipt()


def check_extraction(result, keys=KEYS, decode="pip"):
    assert list(result.fields) == list(keys)
    assert result.decode == decode and result.seconds >= 0 and result.truncated == (result.dropped_tokens > 0)
    for f in result.fields.values():
        assert 0.0 <= f.confidence <= 1.0 and isinstance(f.truncated, bool)
        assert f.grounding in ("exact", "fuzzy", "none")
        assert f.value is not None or (f.boxes == [] and f.grounding == "none")  # missing: nothing grounded
        assert all(0 <= b.x0 <= b.x1 <= 1 and 0 <= b.y0 <= b.y1 <= 1 and b.page >= 0 and b.text for b in f.boxes)
    d = json.loads(result.to_json())
    assert set(d) == {"document", "fields", "decode", "seconds", "truncated", "dropped_tokens"}
    assert all(set(f) == {"value", "confidence", "boxes", "grounding", "truncated"} for f in d["fields"].values())
    return d


def answering(values: dict[str, str | None]):
    """A stand-in for pip_decode that answers `values` (grounding tests need real answers)."""

    def decode(model, builder, texts, schemas, **kw):
        return [{k: FieldResult(values.get(k), 0.9 if values.get(k) else 0.1) for k in s.names} for s in schemas]

    return decode


# ---- extraction ---------------------------------------------------------------------------------
def test_extract_real_receipt_image(tiny_extractor, receipt_doc):
    assert len(receipt_doc.words) > 40 and receipt_doc.page_sizes == [(664, 1664)]
    assert "PETRODELI" in serialize(receipt_doc).upper()
    result = tiny_extractor.extract(receipt_doc)
    assert result.document == "receipt"
    check_extraction(result)


def test_grounded_values_get_boxes_on_the_page(tiny_extractor, receipt_doc, monkeypatch):
    monkeypatch.setattr(
        "pipkie.decoding.pip.pip_decode",
        answering({"company": "PETRODELI ENTERPRISE", "total": "85.54", "date": "26/02/18"}),
    )
    result = tiny_extractor.extract(receipt_doc)
    check_extraction(result)
    f = result.fields
    assert f["company"].grounding == "exact" and [b.text.upper() for b in f["company"].boxes] == [
        "PETRODELI",
        "ENTERPRISE",
    ]
    assert f["total"].boxes and all("85.54" in b.text for b in f["total"].boxes)
    assert f["date"].boxes[0].text == "26/02/18"
    assert f["address"].value is None and f["address"].boxes == []
    company = f["company"].boxes[0]  # top of the receipt, left half
    assert company.y1 < 0.25 and company.x0 < 0.5


def test_field_grounding_directly():
    from pipkie.extract import Extractor

    doc = Document(
        "d",
        words=[
            Word("TOTAL", (100, 800, 200, 820)),
            Word("RM9.90", (700, 800, 790, 820)),
            Word("Thank", (100, 900, 200, 920)),
        ],
        page_sizes=[(500, 1000)],
    )
    f = Extractor._field(doc, FieldResult("9.90", 0.87654321))
    assert f.value == "9.90" and f.confidence == 0.8765 and f.grounding == "exact"
    assert [(b.text, b.x0, b.y0, b.x1, b.y1) for b in f.boxes] == [("RM9.90", 0.7, 0.8, 0.79, 0.82)]
    assert Extractor._field(doc, FieldResult("nowhere to be seen", 0.5)).boxes == []
    assert Extractor._field(doc, FieldResult(None, 0.5)).grounding == "none"
    assert Extractor._field(Document("t", text="TOTAL 9.90"), FieldResult("9.90", 0.5)).boxes == []


def test_born_digital_pdf_needs_no_ocr(tiny_extractor, tmp_path, monkeypatch):
    from tests.test_loaders import make_text_pdf

    def no_ocr(*a, **k):
        raise AssertionError("a PDF with a text layer must not be OCR'd")

    monkeypatch.setattr("pipkie.io.loaders.get_engine", no_ocr)
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(make_text_pdf([[(72, 720, 14, "ACME TRADING"), (72, 300, 12, "TOTAL 9.90")]]))
    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", answering({"company": "ACME TRADING", "total": "9.90"}))
    result = tiny_extractor.extract(pdf, keys="company,total")
    check_extraction(result, ["company", "total"])
    assert result.document == "invoice"
    assert [b.text for b in result.fields["total"].boxes] == ["9.90"]
    assert result.fields["company"].boxes[0].y0 < result.fields["total"].boxes[0].y0  # higher on the page


@needs_sroie
def test_precomputed_ocr_box_file_and_json_words(tiny_extractor, tmp_path):
    result = tiny_extractor.extract(BOX_FILE)
    assert result.document == "X51005447832"
    check_extraction(result)
    words = [
        {"text": w.split(",", 8)[8], "box": [int(v) for v in w.split(",")[:8]]}
        for w in BOX_FILE.read_text(encoding="utf-8", errors="replace").splitlines()
        if w.count(",") >= 8
    ]
    path = tmp_path / "words.json"
    path.write_text(json.dumps({"id": "mine", "words": words, "page_sizes": [[664, 1664]]}))
    result = tiny_extractor.extract(path, keys=["total"])
    assert result.document == "mine"
    check_extraction(result, ["total"])


def test_text_input(tiny_extractor, tmp_path):
    r = tiny_extractor.extract(None, text="Company Acme Trading\nTotal 9.90")
    assert r.document == "text" and not r.truncated
    check_extraction(r)
    p = tmp_path / "note.txt"
    p.write_text("Total 9.90\n")
    check_extraction(tiny_extractor.extract(p, keys="total"), ["total"])


def test_keys_schema_and_decodes(tiny_extractor):
    text = "Date 12/03/2019\nTotal 9.90"
    assert list(tiny_extractor.extract(None, ["total", "date"], text=text).fields) == ["total", "date"]
    schema = {
        "type": "object",
        "properties": {"total": {"type": "string", "maxLength": 9}, "vendor": {"type": ["string", "null"]}},
    }
    check_extraction(tiny_extractor.extract(None, schema=schema, text=text), ["total", "vendor"])
    for decode in ("ar-free", "ar-forced"):
        check_extraction(
            tiny_extractor.extract(None, "total,date", decode=decode, text=text), ["total", "date"], decode
        )
    check_extraction(tiny_extractor.extract(None, "total", refine_steps=2, text=text), ["total"])
    for bad in ("beam", "ar"):  # one name per decoder (`pipkie.decoding.DECODERS`)
        with pytest.raises(ValueError, match="choose one of pip, ar-free, ar-forced"):
            tiny_extractor.extract(None, "total", decode=bad, text=text)
    with pytest.raises(ValueError, match="does not refine"):
        tiny_extractor.extract(None, "total", decode="ar-forced", refine_steps=1, text=text)


def test_batching_changes_nothing(tiny_extractor):
    docs = [
        Document(f"d{i}", text=t)
        for i, t in enumerate(["Total 9.90", "Company Acme Trading Sdn Bhd\nDate 12/03/2019\nTotal 120.00", "x"])
    ]
    together = tiny_extractor.extract_many(docs, batch_size=8)
    alone = [tiny_extractor.extract_many([d])[0] for d in docs]
    assert [r.document for r in together] == ["d0", "d1", "d2"]
    for a, b in zip(together, alone):
        assert a.values() == b.values()
        for k in KEYS:
            assert a.fields[k].confidence == pytest.approx(b.fields[k].confidence, abs=2e-3)


def test_truncation_is_reported(tiny_extractor):
    ex = tiny_extractor
    ks = KeySchema.parse(KEYS)
    room = ex.builder.max_length - ex.builder.template_length(ks) - len(ex.builder.instruction_ids) - 1
    fits = "9" * room  # digits are single tokens: exactly `room` document tokens
    assert len(ex.builder._ids(fits)) == room == ex.builder.document_room(ex.builder.template_length(ks))
    with pytest.warns(UserWarning, match="dropped from the middle"):
        long = ex.extract(None, text=fits + "99")
    assert long.truncated and long.dropped_tokens == 2
    short = ex.extract(None, text=fits)
    assert not short.truncated and short.dropped_tokens == 0
    _, ar_builder = ex.decoder("ar-forced")
    with pytest.warns(UserWarning):  # AR reserves more room than PIP for the answer
        ar = ex.extract(None, decode="ar-forced", text=fits)
    assert ar.truncated and ar.dropped_tokens == ar_builder.ar_reserved(ks) - ex.builder.template_length(ks) - 1


@pytest.mark.skipif(not (KLEISTER / "dev-0").is_dir(), reason="Kleister-NDA data not present")
def test_a_long_contract_keeps_its_end_and_the_flag_says_how_much_was_cut(tiny_extractor):
    """Kleister-NDA contracts are several contexts long: the input keeps the document's first and
    last tokens (slices of its own tokens, a marker line between), and extract says how many were
    dropped."""
    from pipkie.data import read_dataset
    from pipkie.model.template import CUT_MARKER

    ex, ks = tiny_extractor, KeySchema.parse(KEYS)
    doc = next(iter(read_dataset("kleister_nda", KLEISTER, "dev-0", limit=1)))
    text = serialize(doc)
    b = ex.builder
    whole = b.document_ids(text)
    room = b.document_room(b.template_length(ks))
    assert len(whole) > 3 * room
    with pytest.warns(UserWarning, match="dropped from the middle"):
        result = ex.extract(doc)
        enc = b.pip(text, ks)
    assert result.truncated and result.dropped_tokens == len(whole) - room == enc.truncated
    kept = enc.input_ids[len(b.instruction_ids) : enc.prefix_len - 1]
    assert len(kept) == room and len(enc.input_ids) == b.max_length
    a, z = enc.seam
    assert enc.input_ids[a:z] == b.marker_ids and b.tok.decode(b.marker_ids) == CUT_MARKER
    n_head, n_tail = a - len(b.instruction_ids), enc.prefix_len - 1 - z
    assert kept[:n_head] == whole[:n_head] and kept[-n_tail:] == whole[-n_tail:]  # the start and the END
    assert abs(n_head - n_tail) <= 1 and n_tail > room // 3
    last_line = text.rstrip().splitlines()[-1]
    assert last_line.strip() and last_line.strip() in b.tok.decode(kept[-n_tail:])


@pytest.mark.skipif(not (KLEISTER / "dev-0").is_dir(), reason="Kleister-NDA data not present")
def test_a_cut_documents_copy_stream_is_document_tokens_only(tiny_extractor):
    """With the copy head's layout, every copy-stream position of a cut document is a token of the
    document (the marker is left out), so copy positions still map to the document's characters."""
    from pipkie.data import read_dataset
    from pipkie.model.template import TemplateBuilder

    doc = next(iter(read_dataset("kleister_nda", KLEISTER, "dev-0", limit=1)))
    text = serialize(doc)
    b = TemplateBuilder(tiny_extractor.tokenizer, max_length=1024, copy=True, budgets=BUDGETS)
    with pytest.warns(UserWarning):
        enc = b.pip(text, KeySchema.parse(KEYS))
    start, end = b.document_span(enc.prefix_len)
    stream = b.copy_stream(enc.input_ids, start, end, enc.seam)
    whole, offsets = b.document_ids(text), b.document_offsets(text)
    assert not set(range(*enc.seam)) & set(stream) and len(stream) > 500
    assert all(enc.kept[p - start] >= 0 and enc.input_ids[p] == whole[enc.kept[p - start]] for p in stream)
    s, e = offsets[enc.kept[stream[-1] - start]]  # the stream ends where the document does
    assert text[s:e].strip() and text[e:].strip() == ""
    first = offsets[enc.kept[stream[0] - start]]
    assert first[0] == len(text) - len(text.lstrip())


def test_ar_decodes_run_the_ar_baseline(tiny_extractor, tiny_model_dir):
    """--decode ar-free / ar-forced run the model's AR baseline (pipkie.json `ar_baseline`), never the PIP
    weights."""
    from pipkie.decoding.ar import ar_decode
    from pipkie.model.modeling import Settings, builder_for, load_model

    assert Settings.load(tiny_model_dir).ar_baseline == AR_BASELINE
    ar, tok, settings = load_model((tiny_model_dir / AR_BASELINE).resolve())
    assert settings.objective == "ar"
    text, ks = "Date 12/03/2019\nTotal 9.90", KeySchema.parse("total:text,date:text")
    for decode, mode in (("ar-free", "free"), ("ar-forced", "forced")):
        want = ar_decode(ar, builder_for(tok, settings), [text], [ks], mode=mode)[0]
        got = tiny_extractor.extract(None, ks, decode=decode, text=text)
        assert got.values() == {k: f.value for k, f in want.items()}
        assert [f.confidence for f in got.fields.values()] == pytest.approx(
            [want[k].confidence for k in ks.names], abs=1e-4
        )
    # and the PIP weights would have answered otherwise (so the comparison above tells them apart)
    pip_weights = ar_decode(tiny_extractor.model, tiny_extractor.builder, [text], [ks], mode="forced")[0]
    assert [round(f.confidence, 4) for f in got.fields.values()] != [
        round(pip_weights[k].confidence, 4) for k in ks.names
    ]


def test_a_pip_model_without_ar_baseline_refuses_ar_decoding(tmp_path, tiny_model_dir):
    from pipkie.extract import Extractor
    from pipkie.model.modeling import NoARBaseline, Settings

    solo = build_tiny_model(tmp_path / "solo", ar_baseline=None)
    ex = Extractor.from_pretrained(solo)
    for decode in ("ar-free", "ar-forced"):
        with pytest.raises(NoARBaseline, match="no AR baseline"):
            ex.extract(None, "total", decode=decode, text="Total 9.90")
    assert ex.extract(None, "total", text="Total 9.90").decode == "pip"
    # an explicit AR model instead of a baseline
    with_ar = Extractor.from_pretrained(solo, ar_model=(tiny_model_dir / AR_BASELINE).resolve())
    assert with_ar.extract(None, "total", decode="ar-forced", text="Total 9.90").decode == "ar-forced"
    with pytest.raises(ValueError, match="not an AR model"):  # a PIP model is no AR baseline
        Extractor.from_pretrained(solo, ar_model=solo).extract(None, "total", decode="ar-free", text="x")
    # a pipkie.json written before the field existed still loads (no baseline); a named baseline
    # that is not there is a clear error
    raw = json.loads((solo / "pipkie.json").read_text())
    assert raw.pop("ar_baseline") is None
    (solo / "pipkie.json").write_text(json.dumps(raw))
    assert Settings.load(solo).ar_baseline is None and Settings.load(solo).keys == KEYS
    (solo / "pipkie.json").write_text(json.dumps({**raw, "ar_baseline": "../nowhere"}))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Extractor.from_pretrained(solo).extract(None, "total", decode="ar-free", text="x")


def test_cli_extract_ocr_min_score(tmp_path, tiny_model_dir, monkeypatch):
    """--ocr-min-score is checked before the model loads and reaches the OCR of every file."""
    from typer.testing import CliRunner

    import pipkie.pipeline
    from pipkie.cli import app

    note = tmp_path / "note.txt"
    note.write_text("Total 9.90\n")
    runner = CliRunner()
    base = ["extract", str(note), "--model", str(tmp_path / "nowhere"), "--keys", "total"]
    said = lambda res: " ".join(res.output.replace("│", " ").split())  # noqa: E731 - the error box, unwrapped
    res = runner.invoke(app, [*base, "--ocr-min-score", "2"])
    assert res.exit_code == 2 and "must lie in [0, 1], got 2.0" in said(res)
    res = runner.invoke(app, [*base, "--ocr", "tesseract", "--ocr-min-score", "0.5"])
    assert res.exit_code == 2 and "only rapidocr takes a line-score threshold" in said(res)
    seen = []
    monkeypatch.setattr(pipkie.pipeline, "configure_ocr", lambda engine, options: seen.append((engine, options)))
    res = runner.invoke(
        app, ["extract", str(note), "--model", str(tiny_model_dir), "--keys", "total", "--ocr-min-score", "0.6"]
    )
    assert res.exit_code == 0, res.output
    assert seen == [("rapidocr", {"min_score": 0.6})]


def test_cli_extract_ar_without_baseline_is_a_clear_error(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pipkie.cli import app

    solo = build_tiny_model(tmp_path / "solo", ar_baseline=None)
    note = tmp_path / "note.txt"
    note.write_text("Total 9.90\n")
    runner = CliRunner()
    res = runner.invoke(app, ["extract", str(note), "--model", str(solo), "--decode", "ar-forced"])
    assert res.exit_code == 2 and "no AR baseline" in res.stderr and "Traceback" not in res.output
    assert res.stdout == ""
    res = runner.invoke(
        app,
        [
            "extract",
            str(note),
            "--model",
            str(solo),
            "--decode",
            "ar-forced",
            "--ar-model",
            str((tiny_model_dir / AR_BASELINE).resolve()),
        ],
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["decode"] == "ar-forced"


class _Forced(torch.nn.Module):
    """An LM head that makes `token` every position's argmax (a decoder that never ends a value)."""

    def __init__(self, head, token: int):
        super().__init__()
        self.head, self.token = head, token

    @property
    def weight(self):
        return self.head.weight

    def forward(self, h):
        logits = self.head(h).clone()
        logits[..., self.token] += 1e4
        return logits


def test_a_value_that_fills_its_budget_is_flagged(tiny_model_dir):
    """PIP and AR forced alike: a value with no end token inside its budget is `truncated` on its field."""
    from pipkie.extract import Extractor

    ex = Extractor.from_pretrained(tiny_model_dir)
    nine = ex.tokenizer.convert_tokens_to_ids("9")
    for decode in ("pip", "ar-forced"):
        model, _ = ex.decoder(decode)
        model.set_output_embeddings(_Forced(model.get_output_embeddings(), nine))
        r = ex.extract(None, "total:text,date:text", decode=decode, text="Total 9.90")
        assert {k: (f.value, f.truncated) for k, f in r.fields.items()} == {
            "total": ("9" * BUDGETS["total"], True),
            "date": ("9" * BUDGETS["date"], True),
        }
        assert r.to_dict()["fields"]["total"]["truncated"] is True


def test_values_snap_to_words_unless_asked_not_to(tiny_extractor, monkeypatch):
    """`extract(snap=False)` (CLI `--no-snap`) keeps the decoder's raw value; the default completes a
    value cut inside a document word (`pipkie.decoding.snap`)."""
    from pipkie.decoding.pip import PipDecoder

    monkeypatch.setattr(PipDecoder, "decode", lambda self, m, b, texts, *a, **k: [{"total": FieldResult("$60.4", 0.9)}])
    doc = Document(id="t", text="TOTAL $60.44")
    assert tiny_extractor.extract(doc, "total").values() == {"total": "$60.44"}
    assert tiny_extractor.extract(doc, "total", snap=False).values() == {"total": "$60.4"}
