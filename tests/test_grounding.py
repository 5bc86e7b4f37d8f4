"""Grounding values in documents: exact and fuzzy matches, multi-line values, drawing the boxes."""

import json
from pathlib import Path

import pytest
from PIL import Image

from pipkie.io.document import Document, Word
from pipkie.io.grounding import PALETTE, Grounding, draw, ground, ground_fields, locate
from pipkie.io.loaders import load_document

FIXTURES = Path(__file__).parent / "fixtures" / "ocr"
SROIE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sroie" / "train"
RECEIPT = "X51005442333"
needs_sroie = pytest.mark.skipif(not (SROIE / "box" / f"{RECEIPT}.txt").exists(), reason="SROIE data not present")


def squash(text: str) -> str:
    return "".join(text.upper().split())


@pytest.fixture(scope="module")
def receipt():
    doc = load_document(SROIE / "box" / f"{RECEIPT}.txt")
    gold = json.loads((SROIE / "entities" / f"{RECEIPT}.txt").read_text())
    return doc, gold


@pytest.fixture
def small():
    return load_document(FIXTURES / "receipt_box.txt")


@needs_sroie
def test_sroie_company_and_total_are_exact(receipt):
    doc, gold = receipt
    company = locate(gold["company"], doc)
    assert company.method == "exact" and company.score == 1.0
    assert [w.text for w in company.words] == ["UNIHAKKA INTERNATIONAL SDN BHD"]
    total = locate(gold["total"], doc)  # "$6.90"
    assert total.method == "exact" and all(squash(gold["total"]) in squash(w.text) for w in total.words)
    assert len(total.words) == 1


@needs_sroie
def test_sroie_multiline_address(receipt):
    doc, gold = receipt
    # label: "12, JALAN TAMPOI 7/4,KAWASAN PARINDUSTRIAN TAMPOI,81200 JOHOR BAHRU,JOHOR"
    # OCR:   "12,JALAN TAMPOI 7/4,KAWASAN PERINDUSTRIAN" / "TAMPOL,81200 JOHOR BAHRU,JOHOR"
    g = locate(gold["address"], doc)
    assert g.method == "fuzzy" and 0.9 <= g.score < 1
    assert [w.text for w in g.words] == ["12,JALAN TAMPOI 7/4,KAWASAN PERINDUSTRIAN", "TAMPOL,81200 JOHOR BAHRU,JOHOR"]
    assert len({w.box[1] for w in g.words}) == 2  # two lines
    assert ground(gold["address"], doc, threshold=0.99) == []


@needs_sroie
def test_sroie_all_gold_values_ground(receipt):
    doc, gold = receipt
    results = ground_fields(gold, doc)
    assert set(results) == set(gold)
    for key, (value, words) in results.items():
        assert value == gold[key] and words, key


def test_exact_match_does_not_cut_numbers(small):
    words = ground("6.90", small)
    assert [w.text for w in words] == ["RM6.90"]  # not the 16.90 above it
    assert [w.text for w in ground("16.90", small)] == ["16.90"]
    assert [w.text for w in ground("rm 6.90", small)] == ["RM6.90"]  # case and spaces ignored


def test_multiline_exact_match_returns_every_line(small):
    g = locate("12, Jalan Merdeka 3/1, 43000 Kajang, Selangor", small)
    assert g.method == "exact"
    assert [w.text for w in g.words] == ["12, JALAN MERDEKA 3/1,", "43000 KAJANG, SELANGOR"]


def test_fuzzy_match_and_threshold(small):
    g = locate("CORNER CAFE SDN BND", small)
    assert g.method == "fuzzy" and g.score == pytest.approx(16 / 17, abs=0.01)
    assert [w.text for w in g.words] == ["CORNER CAFE SDN BHD"]
    assert ground("CORNER CAFE SDN BND", small, threshold=0.99) == []


def test_no_match_is_empty(small):
    assert ground("QUANTUM FLUX CAPACITOR", small) == []
    assert ground("", small) == []
    assert ground("7.77", small) == []  # short values are never fuzzy-matched
    assert locate("x", Document("empty")) == Grounding() and not Grounding()


def test_word_level_ocr_words_span_lines():
    words = [
        Word("TOTAL", (50, 500, 150, 520)),
        Word("RM", (600, 500, 650, 520)),
        Word("12.50", (660, 500, 750, 520)),
        Word("Lot", (50, 100, 100, 120)),
        Word("5,", (110, 100, 140, 120)),
        Word("Jalan", (50, 130, 120, 150)),
        Word("Besar", (130, 130, 200, 150)),
    ]
    doc = Document("d", words=words)
    assert [w.text for w in ground("Lot 5, Jalan Besar", doc)] == ["Lot", "5,", "Jalan", "Besar"]
    assert [w.text for w in ground("RM12.50", doc)] == ["RM", "12.50"]
    # "12.5" is not an exact match of 12.50 (it would cut the number) but a close fuzzy one, as
    # in SROIE's labels ("43.7" for a receipt's "43.70")
    g = locate("12.5", doc)
    assert g.method == "fuzzy" and [w.text for w in g.words] == ["12.50"] and g.score < 0.9


def test_ground_fields_with_several_values(small):
    out = ground_fields({"price": ["16.90", "RM6.90"], "none": None}, small)
    assert out["price"][0] == "16.90 | RM6.90"
    assert [w.text for w in out["price"][1]] == ["16.90", "RM6.90"]
    assert out["none"] == ("", [])


def test_draw_boxes_and_labels(tmp_path, small):
    image = tmp_path / "receipt.png"
    Image.new("RGB", (720, 340), "white").save(image)  # twice the page size of the box file
    results = ground_fields({"company": "CORNER CAFE SDN BHD", "total": "6.90", "missing": "zzz"}, small)
    out = draw(small, results, image, tmp_path / "out" / "drawn.png")
    drawn = Image.open(out).convert("RGB")
    assert drawn.size == (720, 340)
    x0, y0, x1, y1 = results["total"][1][0].box  # RM6.90 at (300,150)-(360,170) of 360x170
    assert drawn.getpixel((int(x0 * 0.72) + 1, int((y0 + y1) / 2 * 0.34))) == Image.new(
        "RGB", (1, 1), PALETTE[1]
    ).getpixel((0, 0))
    colours = {c for _, c in drawn.getcolors(1 << 20)}
    assert Image.new("RGB", (1, 1), PALETTE[0]).getpixel((0, 0)) in colours  # company box + label


@needs_sroie
def test_draw_on_real_receipt(tmp_path, receipt):
    doc, gold = receipt
    out = draw(doc, ground_fields(gold, doc), doc.images[0], tmp_path / "receipt.jpg.png")
    assert Image.open(out).size == (1080, 1528)
