"""OCR engines: rapidocr on one real SROIE receipt (offline, one thread), errors, tesseract parsing.

Only one receipt is OCR'd (about 3-5 s on one thread), in a module fixture shared by the tests.
"""

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
from PIL import Image

from pipkie.io.document import Document, serialize
from pipkie.io.grounding import locate
from pipkie.io.ocr import (
    OCREngineError,
    OCRError,
    OCRWord,
    RapidOCR,
    Tesseract,
    get_engine,
    load_image,
    parse_tesseract_tsv,
    to_words,
)

SROIE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sroie" / "train"
RECEIPT = "X51005442333"
needs_sroie = pytest.mark.skipif(not (SROIE / "img" / f"{RECEIPT}.jpg").exists(), reason="SROIE data not present")


@pytest.fixture(scope="module")
def receipt_ocr():
    """A fresh (uncached) engine, loaded and run with every network connection refused."""
    engine = RapidOCR(threads=1)
    assert engine._ocr is None  # lazy: nothing loaded before the first call
    real_connect = socket.socket.connect

    def refuse(*args, **kwargs):
        raise AssertionError("OCR tried to open a network connection")

    socket.socket.connect = refuse
    try:
        start = time.perf_counter()
        words = engine(SROIE / "img" / f"{RECEIPT}.jpg")
        elapsed = time.perf_counter() - start
    finally:
        socket.socket.connect = real_connect
    print(f"\nrapidocr, 1 thread, {RECEIPT}: {elapsed:.2f} s (model load included), {len(words)} words")
    return engine, words


@needs_sroie
def test_rapidocr_reads_a_real_receipt(receipt_ocr):
    _, words = receipt_ocr
    gold = json.loads((SROIE / "entities" / f"{RECEIPT}.txt").read_text())
    text = " ".join(w.text for w in words).upper()
    assert gold["total"].lstrip("$") in text
    assert gold["company"] in text
    width, height = Image.open(SROIE / "img" / f"{RECEIPT}.jpg").size
    for w in words:
        x0, y0, x1, y1 = w.box
        assert 0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height
        assert 0 < w.confidence <= 1
    # word-level boxes, not whole lines: the company line comes back as its four words
    assert [w.text for w in words if w.text in gold["company"].split()][:4] == gold["company"].split()
    assert not any(" " in w.text for w in words)


@needs_sroie
def test_rapidocr_words_normalise_and_ground(receipt_ocr):
    _, ocr_words = receipt_ocr
    size = Image.open(SROIE / "img" / f"{RECEIPT}.jpg").size
    doc = Document(RECEIPT, words=to_words(ocr_words, size), page_sizes=[size])
    assert all(0 <= c <= 1000 for w in doc.words for c in w.box)
    assert "UNIHAKKA INTERNATIONAL SDN BHD" in serialize(doc).upper()
    gold = json.loads((SROIE / "entities" / f"{RECEIPT}.txt").read_text())
    total = locate(gold["total"], doc)
    assert total and total.method == "exact"
    address = locate(gold["address"], doc)  # OCR spells PERINDUSTRIAN, the label PARINDUSTRIAN
    assert address.score >= 0.8 and len({w.box[1] // 10 for w in address.words}) >= 2


@needs_sroie
def test_rapidocr_runs_onnx_on_the_configured_threads(receipt_ocr):
    engine, _ = receipt_ocr
    for model in (engine._ocr.text_det, engine._ocr.text_rec):
        opts = model.session.session.get_session_options()
        assert opts.intra_op_num_threads == 1 and opts.inter_op_num_threads == 1


def test_get_engine_is_cached_and_lazy():
    engine = get_engine("rapidocr", threads=1)
    assert engine is get_engine("rapidocr", 1)
    assert engine is not get_engine("rapidocr", 2)
    with pytest.raises(OCREngineError, match="unknown OCR engine"):
        get_engine("nope")


def test_rapidocr_drops_lines_it_doubts(monkeypatch):
    """rapidocr is told to drop lines it scores under 0.9 (its own default, 0.5, lets logos and
    stamps through as text), and `set_engine_options` can lower it again."""
    import rapidocr

    from pipkie.io import ocr

    seen = []
    monkeypatch.setattr(rapidocr, "RapidOCR", lambda params: seen.append(params) or object())
    RapidOCR(threads=1)._engine()
    ocr.set_engine_options("rapidocr", min_score=0.5)
    try:
        get_engine("rapidocr", threads=1)._engine()
    finally:
        ocr.set_engine_options("rapidocr")
    assert [p["Global.text_score"] for p in seen] == [0.9, 0.5]
    with pytest.raises(ValueError, match="min_score must lie in"):
        RapidOCR(min_score=1.5)


def test_unreadable_images_raise_ocr_error(tmp_path):
    engine = RapidOCR(threads=1)  # fails before any model is loaded
    with pytest.raises(OCRError, match="cannot read image"):
        engine(b"\x89PNG\r\n\x1a\nnot really a png")
    with pytest.raises(OCRError, match="no such file"):
        engine(tmp_path / "missing.png")
    with pytest.raises(OCRError, match="empty"):
        engine(Image.new("RGB", (1, 1)))
    assert engine._ocr is None


@needs_sroie
def test_truncated_jpeg_is_an_ocr_error():
    data = (SROIE / "img" / f"{RECEIPT}.jpg").read_bytes()
    with pytest.raises(OCRError):
        load_image(data[: len(data) // 3])


def test_load_image_normalises_modes():
    assert load_image(Image.new("RGBA", (20, 10))).mode == "RGB"
    assert load_image(Image.new("I;16", (20, 10), 40000)).getpixel((0, 0)) == (156, 156, 156)
    assert load_image(Image.new("1", (20, 10))).size == (20, 10)


def test_tesseract_needs_its_binary():
    if shutil.which("tesseract"):
        assert Tesseract(threads=1).binary
    else:
        with pytest.raises(OCREngineError, match="apt-get install tesseract-ocr"):
            get_engine("tesseract")


def test_parse_tesseract_tsv():
    tsv = (
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
        "1\t1\t0\t0\t0\t0\t0\t0\t600\t200\t-1\t\n"
        "4\t1\t1\t1\t1\t0\t10\t10\t300\t30\t-1\t\n"
        "5\t1\t1\t1\t1\t1\t10\t10\t100\t30\t96.5\tTOTAL\n"
        "5\t1\t1\t1\t1\t2\t120\t10\t80\t30\t91\t12.50\n"
        "5\t1\t1\t1\t2\t1\t10\t60\t80\t30\t88\tCASH\n"
        "5\t1\t1\t1\t2\t2\t100\t60\t80\t30\t-1\t \n"
    )
    words = parse_tesseract_tsv(tsv)
    assert words == [
        OCRWord("TOTAL", (10, 10, 110, 40), 0.965, 0),
        OCRWord("12.50", (120, 10, 200, 40), 0.91, 0),
        OCRWord("CASH", (10, 60, 90, 90), 0.88, 1),
    ]


def test_to_words_drops_blank_text_and_sets_page():
    words = to_words([OCRWord("A", (0, 0, 50, 20), 0.9), OCRWord(" ", (0, 0, 1, 1), 0.9)], (100, 40), page=2)
    assert len(words) == 1 and words[0].box == (0, 0, 500, 500) and words[0].page == 2


def test_pixel_limit_before_decoding(monkeypatch):
    from pipkie.io.ocr import MAX_PIXELS, ImageTooLarge

    big = Image.new("L", (300, 200))
    buf = __import__("io").BytesIO()
    big.save(buf, "PNG")
    decoded = []
    real_load = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self.size) or real_load(self))
    with pytest.raises(ImageTooLarge, match="300x200 = 60,000 pixels, more than the limit of 50,000") as e:
        load_image(buf.getvalue(), max_pixels=50_000)
    assert decoded == [] and e.value.reason.startswith("image is 300x200")
    assert load_image(buf.getvalue(), max_pixels=60_000).size == (300, 200)
    assert MAX_PIXELS == 40_000_000 and issubclass(ImageTooLarge, OCRError)


def test_engine_errors_say_whether_the_engine_is_missing():
    with pytest.raises(OCREngineError) as e:
        get_engine("nope")
    assert e.value.unavailable
    assert not OCREngineError("rapidocr failed: boom", unavailable=False).unavailable
