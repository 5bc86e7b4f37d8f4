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
from PIL import Image

from pipkie.decode import FieldResult
from pipkie.document import Document, Word, serialize
from pipkie.schema import KeySchema

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "receipt.jpg"  # SROIE train X51005447832, bundled
SROIE = ROOT.parent / "shared" / "data" / "sroie" / "train"
BOX_FILE = SROIE / "box" / "X51005447832.txt"
needs_sroie = pytest.mark.skipif(not BOX_FILE.exists(), reason="SROIE data not present")
KEYS = ["company", "date", "address", "total"]
BUDGETS = {"company": 8, "date": 6, "address": 12, "total": 5}

TOKENIZER_TEXT = [
    "PETRODELI ENTERPRISE COMPANY NO: SA0127959-D LOT 485, TMN LEMBAH KERAMAT JLN ULU KELANG 54200 KUALA LUMPUR",
    "TOTAL RM 85.54 VISA GST 26/02/18 08:28 INVOICE NUMBER THANK YOU PLEASE COME AGAIN SDN BHD JALAN TAMAN",
    "Total 9.90 Date 12/03/2019 Company Acme Trading Address 7 Main Street company date address total unknown : \n",
]


def build_tiny_model(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer qwen2 pipkie model directory (tokenizer, weights, pipkie.json): ~1 s on a CPU."""
    from transformers import AutoModelForCausalLM

    from pipkie.modeling import Settings, add_tokens_to_model, compact_config
    from pipkie.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    directory = Path(directory)
    if (directory / "pipkie.json").exists():
        return directory
    tok = train_tokenizer(TOKENIZER_TEXT * 4, vocab_size=500, special=list(SPECIAL_TOKENS))
    torch.manual_seed(seed)
    cfg = compact_config(len(tok), "qwen2", hidden=64, layers=2, heads=4, ffn=128, max_positions=1024)
    model = AutoModelForCausalLM.from_config(cfg)
    add_tokens_to_model(model, tok)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Settings(keys=KEYS, budgets=BUDGETS, max_length=1024).save(directory)
    return directory


@functools.lru_cache(maxsize=None)
def load_tiny_extractor(path: str):
    from pipkie.extract import Extractor

    return Extractor.from_pretrained(path)


@functools.lru_cache(maxsize=None)
def ocr_receipt() -> Document:
    from pipkie.loaders import load_document

    return load_document(SAMPLE)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    # one directory per session even when this fixture is imported into several test modules
    return build_tiny_model(tmp_path_factory.getbasetemp() / "pipkie-tiny-model")


@pytest.fixture(scope="session")
def tiny_extractor(tiny_model_dir):
    return load_tiny_extractor(str(tiny_model_dir))


@pytest.fixture(scope="session")
def receipt_doc() -> Document:
    """The bundled receipt, OCR'd once (rapidocr, ~3 s)."""
    return ocr_receipt()


def check_extraction(result, keys=KEYS, decode="pip"):
    assert list(result.fields) == list(keys)
    assert result.decode == decode and result.seconds >= 0 and isinstance(result.truncated, bool)
    for f in result.fields.values():
        assert 0.0 <= f.confidence <= 1.0
        assert f.grounding in ("exact", "fuzzy", "none")
        if f.value is None:
            assert f.boxes == [] and f.grounding == "none"
        for b in f.boxes:
            assert 0 <= b.x0 <= b.x1 <= 1 and 0 <= b.y0 <= b.y1 <= 1 and b.page >= 0 and b.text
    d = json.loads(result.to_json())
    assert set(d) == {"document", "fields", "decode", "seconds", "truncated"}
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
    monkeypatch.setattr("pipkie.extract.pip_decode",
                        answering({"company": "PETRODELI ENTERPRISE", "total": "85.54", "date": "26/02/18"}))
    result = tiny_extractor.extract(receipt_doc)
    check_extraction(result)
    f = result.fields
    assert f["company"].grounding == "exact" and [b.text.upper() for b in f["company"].boxes] == ["PETRODELI", "ENTERPRISE"]
    assert f["total"].boxes and all("85.54" in b.text for b in f["total"].boxes)
    assert f["date"].boxes[0].text == "26/02/18"
    assert f["address"].value is None and f["address"].boxes == []
    company = f["company"].boxes[0]  # top of the receipt, left half
    assert company.y1 < 0.25 and company.x0 < 0.5


def test_field_grounding_directly():
    from pipkie.extract import Extractor

    doc = Document("d", words=[Word("TOTAL", (100, 800, 200, 820)), Word("RM9.90", (700, 800, 790, 820)),
                               Word("Thank", (100, 900, 200, 920))], page_sizes=[(500, 1000)])
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

    monkeypatch.setattr("pipkie.loaders.get_engine", no_ocr)
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(make_text_pdf([[(72, 720, 14, "ACME TRADING"), (72, 300, 12, "TOTAL 9.90")]]))
    monkeypatch.setattr("pipkie.extract.pip_decode", answering({"company": "ACME TRADING", "total": "9.90"}))
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
    words = [{"text": w.split(",", 8)[8], "box": [int(v) for v in w.split(",")[:8]]}
             for w in BOX_FILE.read_text(encoding="utf-8", errors="replace").splitlines() if w.count(",") >= 8]
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
    schema = {"type": "object", "properties": {"total": {"type": "string", "maxLength": 9},
                                               "vendor": {"type": ["string", "null"]}}}
    check_extraction(tiny_extractor.extract(None, schema=schema, text=text), ["total", "vendor"])
    for decode in ("ar", "ar-forced"):
        check_extraction(tiny_extractor.extract(None, "total,date", decode=decode, text=text), ["total", "date"], decode)
    check_extraction(tiny_extractor.extract(None, "total", refine_steps=2, text=text), ["total"])
    with pytest.raises(ValueError, match="decode must be one of"):
        tiny_extractor.extract(None, "total", decode="beam", text=text)


def test_batching_changes_nothing(tiny_extractor):
    docs = [Document(f"d{i}", text=t) for i, t in enumerate(
        ["Total 9.90", "Company Acme Trading Sdn Bhd\nDate 12/03/2019\nTotal 120.00", "x"])]
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
    assert len(ex.builder._ids(fits)) == room
    with pytest.warns(UserWarning):
        long = ex.extract(None, text=fits + "9")
    assert long.truncated and not ex.extract(None, text=fits).truncated
    with pytest.warns(UserWarning):  # AR reserves more room than PIP for the answer
        assert ex.extract(None, decode="ar-forced", text=fits).truncated


# ---- explain ------------------------------------------------------------------------------------
def test_word_spans_match_serialize():
    from pipkie.explain import word_spans

    doc = Document("d", words=[Word("b", (300, 10, 400, 30)), Word("a", (10, 12, 100, 30)), Word(" ", (0, 40, 5, 50)),
                               Word("second line", (10, 100, 300, 130)), Word("p2", (10, 10, 50, 30), page=1)])
    text, spans = word_spans(doc)
    assert text == serialize(doc) == "a b\nsecond line\np2"
    assert [(text[s:e], w.text) for s, e, w in spans] == [(w.text, w.text) for _, _, w in spans]
    assert word_spans(Document("t", text="plain")) == ("plain", [])


def test_explain_weights_over_ocr_words(tiny_extractor, receipt_doc, tmp_path):
    from pipkie.explain import draw_heatmap, explain

    ex = tiny_extractor
    e = explain(ex, receipt_doc, "total")
    assert ex.model.config._attn_implementation != "eager"  # switched back after the call
    assert e.key == "total" and e.slots == BUDGETS["total"]
    assert len(e.words) == len([w for w in receipt_doc.words if w.text.strip()])
    weights = [x for _, x in e.words]
    assert all(x >= 0 for x in weights) and 0.5 < sum(weights) <= 1 + 1e-5  # the rest: line breaks
    assert sum(x for *_, x in e.tokens) == pytest.approx(1, abs=1e-4) and 0 < e.document_share <= 1
    assert e.top(3)[0][1] == max(weights)
    ref = ex.extract(receipt_doc).fields["total"]  # the same forward pass (eager instead of sdpa)
    assert e.value == ref.value and e.confidence == pytest.approx(ref.confidence, abs=1e-3)
    out = draw_heatmap(e, SAMPLE, tmp_path / "heat.png", doc=receipt_doc)
    with Image.open(out) as im:
        assert im.width == 664 and im.height > 1664  # the page + a banner
    d = e.to_dict(top=5)
    assert len(d["words"]) == 5 and all(0 <= v <= 1 for w in d["words"] for v in w["box"])


def test_explain_text_and_errors(tiny_extractor, tmp_path):
    from pipkie.explain import draw_heatmap, explain

    e = explain(tiny_extractor, None, "total", text="Total 9.90", keys=["company", "total"])
    assert e.words == [] and "".join(t for t, *_ in e.tokens) == "Total 9.90"
    assert draw_heatmap(e, Document("t", text="Total 9.90"), tmp_path / "t.png").exists()
    alone = explain(tiny_extractor, None, "vendor", text="Total 9.90")  # not a model key: decoded alone
    assert alone.key == "vendor" and alone.slots == tiny_extractor.settings.default_budget
    with pytest.raises(ValueError, match="not among the keys"):
        explain(tiny_extractor, None, "total", text="x", keys=["date"])
    doc = Document("w", words=[Word("TOTAL", (100, 800, 200, 820)), Word("9.90", (700, 800, 790, 820))],
                   page_sizes=[(500, 1000)])
    out = draw_heatmap(explain(tiny_extractor, doc, "total"), doc, tmp_path / "w.png")
    with Image.open(out) as im:  # no image: the words are drawn on a white page of the page's shape
        assert im.width == 500 and im.height > 1000


def test_slot_attention_hooks_match_output_attentions(tiny_extractor):
    from pipkie.explain import _slot_attention, eager_attention

    model = tiny_extractor.model
    ids = torch.tensor([tiny_extractor.builder._ids("Total 9.90 and more")])
    rows = torch.tensor([2, 3])
    with eager_attention(model), torch.inference_mode():
        logits, per_layer = _slot_attention(model, rows, input_ids=ids)
        full = model(input_ids=ids, output_attentions=True)
    assert len(per_layer) == len(full.attentions) == 2 and torch.allclose(logits, full.logits)
    for mine, ref in zip(per_layer, full.attentions):
        assert torch.allclose(mine, ref[0, :, rows, :].mean(0), atol=1e-6)
