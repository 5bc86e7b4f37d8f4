"""`pipkie explain`: it decodes exactly as extract does (same value, same confidence, copy head
included) and shows what chose the value: the copy head's start distribution over the words and the
attention of the field's slots, as listings and heat maps. Tiny random models (test_extract.py)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from pipkie.io.document import Document, Word, serialize
from tests import test_extract
from tests.test_extract import BUDGETS, KLEISTER, SAMPLE

# test_extract.py's fixtures, used here by name (pytest finds fixtures among a module's globals)
receipt_doc, tiny_copy_extractor = test_extract.receipt_doc, test_extract.tiny_copy_extractor
tiny_extractor, tiny_model_dir = test_extract.tiny_extractor, test_extract.tiny_model_dir


def test_word_spans_match_serialize():
    from pipkie.explain import word_spans

    doc = Document(
        "d",
        words=[
            Word("b", (300, 10, 400, 30)),
            Word("a", (10, 12, 100, 30)),
            Word(" ", (0, 40, 5, 50)),
            Word("second line", (10, 100, 300, 130)),
            Word("p2", (10, 10, 50, 30), page=1),
        ],
    )
    text, spans = word_spans(doc)
    assert text == serialize(doc) == "a b\nsecond line\np2"
    assert [(text[s:e], w.text) for s, e, w in spans] == [(w.text, w.text) for _, _, w in spans]
    assert word_spans(Document("t", text="plain")) == ("plain", [])


def test_explain_weights_over_ocr_words(tiny_extractor, receipt_doc, tmp_path):  # noqa: F811
    from pipkie.explain import explain
    from pipkie.io.heatmap import draw_heatmap

    ex = tiny_extractor
    e = explain(ex, receipt_doc, "total")
    assert ex.model.config._attn_implementation != "eager"  # switched back after the call
    assert e.key == "total" and e.slots == BUDGETS["total"] and not e.copy_head
    assert [x for _, x in e.starts] == [0.0] * len(e.words) and e.start_tokens == []
    assert len(e.words) == len([w for w in receipt_doc.words if w.text.strip()])
    weights = [x for _, x in e.words]
    assert all(x >= 0 for x in weights) and 0.5 < sum(weights) <= 1 + 1e-5  # the rest: line breaks
    assert sum(x for *_, x in e.tokens) == pytest.approx(1, abs=1e-4) and 0 < e.document_share <= 1
    assert e.top(3)[0][1] == max(weights)
    ref = ex.extract(receipt_doc).fields["total"]  # the same decoding: the same numbers, exactly
    assert (e.value, e.confidence, e.value_truncated) == (ref.value, ref.confidence, ref.truncated)
    out = draw_heatmap(e, SAMPLE, tmp_path / "heat.png", doc=receipt_doc)
    with Image.open(out) as im:
        assert im.width == 664 and im.height > 1664  # one panel (no copy head) + a banner
    d = e.to_dict(top=5)
    assert len(d["words"]) == 5 and all(0 <= v <= 1 for w in d["words"] for v in w["box"])


def test_explain_with_a_copy_head_shows_where_the_value_starts(tiny_copy_extractor, receipt_doc, tmp_path):  # noqa: F811
    """With a copy head, explain reports extract's value and confidence (the copy head decides them)
    and the head's start distribution: over the copy stream it sums to 1, over words to what falls
    on words; the heat map draws it beside the attention."""
    from pipkie.decoding.pip import pip_decode
    from pipkie.explain import explain
    from pipkie.io.heatmap import draw_heatmap
    from pipkie.schema import KeySchema

    ex = tiny_copy_extractor
    assert ex.settings.copy_head
    for key in ("total", "company"):
        e = explain(ex, receipt_doc, key)
        ref = ex.extract(receipt_doc).fields[key]
        assert (e.value, e.confidence, e.value_truncated) == (ref.value, ref.confidence, ref.truncated)
        assert e.copy_head and sum(p for *_, p in e.start_tokens) == pytest.approx(1, abs=1e-4)
        on_words = sum(x for _, x in e.starts)
        assert 0.5 < on_words <= 1 + 1e-5 and e.top_starts(1)[0][1] == max(x for _, x in e.starts)
    # the distribution shown is the one the decoder computed (here for "company", the last key)
    trace = []
    pip_decode(
        ex.model,
        ex.builder,
        [serialize(receipt_doc)],
        [KeySchema.parse(ex.settings.keys)],
        pattern=ex.settings.pattern,
        trace=trace,
    )
    assert [p for *_, p in e.start_tokens] == pytest.approx(trace[0]["company"].p_start, abs=1e-6)
    out = draw_heatmap(e, SAMPLE, tmp_path / "heat.png", doc=receipt_doc)
    with Image.open(out) as im:
        assert im.width == 2 * 664 + 12 and im.height > 1664  # copy head | attention, side by side
    d = e.to_dict(top=3)
    assert d["copy_head"] and len(d["starts"]) == 3 and d["starts"][0]["weight"] >= d["starts"][1]["weight"]


@pytest.mark.skipif(not (KLEISTER / "dev-0").is_dir(), reason="Kleister-NDA data not present")
def test_explain_a_cut_contract(tiny_copy_extractor):  # noqa: F811
    """A document cut to fit: every copy-stream position is still a document token (all of p_start
    lands on the document's characters) and the cut is reported."""
    from pipkie.data import read_dataset
    from pipkie.explain import explain

    doc = next(iter(read_dataset("kleister_nda", KLEISTER, "dev-0", limit=1)))
    e = explain(tiny_copy_extractor, doc, "total")  # the cut is reported in e.truncated, not warned
    text = serialize(doc)
    assert e.truncated > 0 and e.words == []  # text only: no OCR words
    assert sum(p for *_, p in e.start_tokens) == pytest.approx(1, abs=1e-4)
    assert all(text[s:t] == tok for tok, s, t, _ in e.start_tokens)
    assert max(t for _, _, t, _ in e.start_tokens) > len(text) - 200  # the end of the contract is in


def test_explain_text_and_errors(tiny_extractor, tmp_path):  # noqa: F811
    from pipkie.explain import explain
    from pipkie.io.heatmap import draw_heatmap

    e = explain(tiny_extractor, None, "total", text="Total 9.90", keys=["company", "total"])
    assert e.words == [] and "".join(t for t, *_ in e.tokens) == "Total 9.90"
    assert draw_heatmap(e, Document("t", text="Total 9.90"), tmp_path / "t.png").exists()
    alone = explain(tiny_extractor, None, "vendor", text="Total 9.90")  # not a model key: decoded alone
    assert alone.key == "vendor" and alone.slots == tiny_extractor.settings.default_budget
    with pytest.raises(ValueError, match="not among the keys"):
        explain(tiny_extractor, None, "total", text="x", keys=["date"])
    doc = Document(
        "w", words=[Word("TOTAL", (100, 800, 200, 820)), Word("9.90", (700, 800, 790, 820))], page_sizes=[(500, 1000)]
    )
    out = draw_heatmap(explain(tiny_extractor, doc, "total"), doc, tmp_path / "w.png")
    with Image.open(out) as im:  # no image: the words are drawn on a white page of the page's shape
        assert im.width == 500 and im.height > 1000


def test_cli_explain_lists_the_copy_heads_starts_and_the_attention(tmp_path, tiny_copy_extractor):  # noqa: F811
    from typer.testing import CliRunner

    from pipkie.cli import app

    words = tmp_path / "words.json"
    words.write_text(
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
    out = tmp_path / "heat.png"
    res = CliRunner().invoke(
        app,
        ["explain", str(words), "--key", "total", "--model", tiny_copy_extractor.name, "--out", str(out), "--top", "2"],
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    ref = tiny_copy_extractor.extract(words).fields["total"]
    assert lines[0].startswith(f"total = {ref.value!r} (confidence {ref.confidence:.2f})")
    assert lines[1].startswith("copy head, where the value starts") and lines[4].startswith("attention of its")
    assert sum(line.startswith("  ") for line in lines) == 4 and out.exists()


def test_slot_attention_hooks_match_output_attentions(tiny_extractor):  # noqa: F811
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
