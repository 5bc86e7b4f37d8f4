"""load_document: PDFs (text layer / scanned), images incl. multi-page TIFF, box files, JSON, text, errors.

Only one small generated page is really OCR'd (the PDF without a text layer); the other image
tests swap in a fake engine, so they test the loader and not the OCR.
"""

import io
import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

import pipkie.io.loaders as loaders
from pipkie.io.document import serialize
from pipkie.io.loaders import DocumentError, load_document
from pipkie.io.ocr import OCRWord
from pipkie.io.pdf import render_pdf_page

FIXTURES = Path(__file__).parent / "fixtures" / "ocr"
SROIE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sroie" / "train"
needs_sroie = pytest.mark.skipif(not (SROIE / "box").is_dir(), reason="SROIE data not present")


def make_text_pdf(pages: list[list[tuple[float, float, float, str]]], size=(612, 792)) -> bytes:
    """A minimal PDF whose pages carry Helvetica text (x, y from the bottom-left, font size, text)."""
    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", None, b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for runs in pages:
        stream = b"".join(f"BT /F1 {s} Tf {x} {y} Td ({t}) Tj ET\n".encode("latin-1") for x, y, s, t in runs)
        page_no, content_no = len(objs) + 1, len(objs) + 2
        kids.append(f"{page_no} 0 R")
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {size[0]} {size[1]}] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {content_no} 0 R >>".encode()
        )
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"endstream")
    objs[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {n} >>".encode()
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def text_image(lines: list[str], size=(600, 220)) -> Image.Image:
    im = Image.new("RGB", size, "white")
    draw, font = ImageDraw.Draw(im), ImageFont.load_default(size=36)
    for i, line in enumerate(lines):
        draw.text((30, 30 + 90 * i), line, fill="black", font=font)
    return im


class FakeEngine:
    """Returns one word per call: 'page<N>' covering the left half of the image."""

    name = "fake"

    def __init__(self):
        self.sizes = []

    def __call__(self, image):
        self.sizes.append(image.size)
        w, h = image.size
        return [OCRWord(f"page{len(self.sizes) - 1}", (0, 0, w / 2, h), 0.99)]


@pytest.fixture
def fake_ocr(monkeypatch):
    engine = FakeEngine()
    monkeypatch.setattr(loaders, "get_engine", lambda name="rapidocr", threads=1: engine)
    return engine


@pytest.fixture
def no_ocr(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("OCR should not run")

    monkeypatch.setattr(loaders, "get_engine", fail)


def test_pdf_text_layer_gives_words_and_boxes(no_ocr, tmp_path):
    pdf = make_text_pdf(
        [
            [(72, 720, 20, "INVOICE No. 4711"), (72, 100, 12, "Total due: 12.50 EUR")],
            [(306, 396, 10, "Page two")],
        ]
    )
    path = tmp_path / "invoice.pdf"
    path.write_bytes(pdf)
    doc = load_document(path)
    assert doc.id == "invoice" and doc.images == []
    assert [w.text for w in doc.words] == ["INVOICE", "No.", "4711", "Total", "due:", "12.50", "EUR", "Page", "two"]
    assert [w.page for w in doc.words] == [0] * 7 + [1] * 2
    assert doc.page_sizes == [(1700, 2200), (1700, 2200)]  # US letter at 200 dpi
    invoice, total = doc.words[0], doc.words[3]
    assert 110 <= invoice.box[0] <= 125 and 55 <= invoice.box[1] <= 80  # x 72/612, y (792-740)/792
    assert total.box[1] > 850 and total.box[2] > total.box[0]
    assert doc.words[7].box[0] == pytest.approx(500, abs=3)
    assert serialize(doc).splitlines()[0] == "INVOICE No. 4711"
    # the same bytes from an upload
    assert load_document(pdf, filename="up.pdf").words == doc.words


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_pdf_text_boxes_match_the_rendered_page(no_ocr, rotate):
    pdf = make_text_pdf([[(72, 700, 30, "HELLO")]]).replace(b"/MediaBox", b"/Rotate %d /MediaBox" % rotate)
    doc = load_document(pdf, filename="r.pdf")
    (word,) = doc.words
    image = render_pdf_page(pdf, 0, doc.page_sizes[0]).convert("L")
    assert image.size == doc.page_sizes[0]
    ink = Image.eval(image, lambda v: 255 if v < 128 else 0).getbbox()  # the rendered glyphs
    ink = [
        ink[0] * 1000 / image.width,
        ink[1] * 1000 / image.height,
        ink[2] * 1000 / image.width,
        ink[3] * 1000 / image.height,
    ]
    # the word's (loose, font-height) box contains the ink, give or take a pixel
    assert word.box[0] <= ink[0] + 3 and word.box[1] <= ink[1] + 3
    assert word.box[2] >= ink[2] - 3 and word.box[3] >= ink[3] - 3
    assert (word.box[2] - word.box[0]) * (word.box[3] - word.box[1]) < 3 * (ink[2] - ink[0]) * (ink[3] - ink[1])


def test_scanned_pdf_is_rendered_and_ocrd(tmp_path):
    buf = io.BytesIO()
    text_image(["INVOICE 2024-07", "TOTAL 12.50"]).save(buf, "PDF", resolution=100)
    doc = load_document(buf.getvalue(), filename="scan.pdf")
    texts = [w.text for w in doc.words]
    assert "TOTAL" in texts and "12.50" in texts
    assert doc.page_sizes == [(1200, 440)]  # 6 x 2.2 inches at 200 dpi
    total = doc.words[texts.index("TOTAL")]
    assert 30 <= total.box[0] <= 80 and 500 <= total.box[1] <= 650


def test_multipage_tiff_ocrs_every_frame(fake_ocr, tmp_path):
    frames = [Image.new("RGB", (300 + 100 * i, 200), "white") for i in range(3)]
    path = tmp_path / "scan.tiff"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    doc = load_document(path)
    assert [w.text for w in doc.words] == ["page0", "page1", "page2"]
    assert [w.page for w in doc.words] == [0, 1, 2]
    assert doc.page_sizes == [(300, 200), (400, 200), (500, 200)]
    assert doc.images == [str(path)] * 3
    assert doc.words[0].box == (0, 0, 500, 1000)
    with pytest.raises(DocumentError, match="scan.tiff: 3 pages, more than the limit of 2"):
        load_document(path, max_pages=2)


def test_image_bytes_and_png_path(fake_ocr, tmp_path):
    buf = io.BytesIO()
    Image.new("L", (120, 80), 255).save(buf, "PNG")
    doc = load_document(buf.getvalue(), filename="upload.png", content_type="image/png")
    assert doc.id == "upload" and doc.page_sizes == [(120, 80)] and doc.images == []
    path = tmp_path / "a.png"
    path.write_bytes(buf.getvalue())
    assert load_document(path).images == [str(path)]


def test_corrupt_images_raise_document_error(fake_ocr, tmp_path):
    with pytest.raises(DocumentError, match="photo.jpg"):
        load_document(b"\xff\xd8\xff\xe0 this is not a jpeg", filename="photo.jpg")
    with pytest.raises(DocumentError, match="photo.png: not a readable image"):
        load_document(b"garbage bytes \x00\x01", filename="photo.png")
    with pytest.raises(DocumentError, match="x.jpg"):
        load_document(b"garbage", content_type="image/jpeg", filename="x.jpg")
    buf = io.BytesIO()
    Image.new("RGB", (400, 400), "red").save(buf, "JPEG")
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(buf.getvalue()[:300])
    with pytest.raises(DocumentError, match="cut.jpg"):
        load_document(truncated)
    assert fake_ocr.sizes == []


def test_corrupt_and_oversized_pdfs(no_ocr, tmp_path):
    with pytest.raises(DocumentError, match="bad.pdf: not a readable PDF"):
        load_document(b"%PDF-1.4\nnonsense", filename="bad.pdf")
    with pytest.raises(DocumentError, match="not a PDF"):
        load_document(b"hello", filename="fake.pdf")
    pdf = make_text_pdf([[(72, 700, 12, "a")], [(72, 700, 12, "b")]])
    with pytest.raises(DocumentError, match="2 pages, more than the limit of 1"):
        load_document(pdf, filename="two.pdf", max_pages=1)


PDF_RACE = """
import sys, threading
sys.path.insert(0, {root!r})
from tests.test_loaders import make_text_pdf
from pipkie.io.loaders import load_document
from pipkie.io.pdf import render_pdf_page

pdf = make_text_pdf([[(72, 700, 24, f"PAGE {{i}} TOTAL 9.90")] for i in range(4)])
words = load_document(pdf, filename="x.pdf").words

def work():
    for j in range(40):
        render_pdf_page(pdf, j % 4, dpi=60)
        assert load_document(pdf, filename="x.pdf").words == words

threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print("survived")
"""


def test_pdfs_read_and_rendered_on_many_threads_at_once():
    """PDFium is not thread-safe (pipkie.io.pdf.PDFIUM): without the lock this process dies of a
    double free or a segmentation fault (4 runs of 4), as the service did under concurrent PDF
    requests. In a subprocess, so that a crash fails this test and not the whole run."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    run = subprocess.run(
        [sys.executable, "-c", PDF_RACE.format(root=root)], capture_output=True, text=True, timeout=600, cwd=root
    )
    assert run.returncode == 0 and "survived" in run.stdout, (run.returncode, run.stderr[-2000:])


def test_other_bad_inputs(tmp_path):
    with pytest.raises(DocumentError, match="missing.pdf: cannot read file"):
        load_document(tmp_path / "missing.pdf")
    with pytest.raises(DocumentError, match="empty.txt: file is empty"):
        load_document(b"", filename="empty.txt")
    with pytest.raises(DocumentError, match="unsupported"):
        load_document(b"\x00\x9f\x92\x96 binary", filename="blob.bin")
    with pytest.raises(TypeError):
        load_document()
    assert issubclass(DocumentError, ValueError)


@needs_sroie
def test_sroie_box_file_path():
    from pipkie.data.sroie import read_sroie

    doc = load_document(SROIE / "box" / "X51005442333.txt")
    gold = next(d for d in read_sroie(SROIE.parent, "train") if d.id == "X51005442333")
    assert doc.id == gold.id and doc.words == gold.words
    assert doc.page_sizes == [(1080, 1528)]  # from images.jsonl, not from the boxes
    assert doc.images == [str(SROIE / "img" / "X51005442333.jpg")]
    assert doc.words[0].text == "UNIHAKKA INTERNATIONAL SDN BHD"


def test_box_file_bytes_and_fixture():
    data = (FIXTURES / "receipt_box.txt").read_bytes()
    doc = load_document(data, filename="receipt_box.txt")
    assert doc.id == "receipt_box" and doc.text is None
    assert doc.page_sizes == [(360, 170)]  # extent of the boxes
    assert doc.words[0].text == "CORNER CAFE SDN BHD"
    assert doc.words[-1].box == (833, 882, 1000, 1000)
    bad = data + b"1,2,3,x,5,6,7,8,oops\n"
    with pytest.raises(DocumentError, match="receipt_box.txt:8: coordinates are not numbers"):
        load_document(bad, filename="receipt_box.txt")


def test_json_words_in_pixels():
    doc = load_document(FIXTURES / "words.json")
    assert doc.id == "two-page-form"
    assert doc.page_sizes == [(800, 1000), (400, 500)]
    assert [(w.text, w.page) for w in doc.words] == [("Invoice", 0), ("No.", 0), ("A-17", 0), ("Total", 1), ("9.90", 1)]
    assert doc.words[0].box == (100, 50, 300, 90)
    assert doc.words[4].box == (750, 800, 900, 850)  # 8 corner coordinates


def test_json_words_normalised_and_errors():
    words = {"words": [{"text": "Total", "box": [10, 20, 110, 40]}]}
    doc = load_document(json.dumps(words).encode(), filename="w.json")
    assert doc.words[0].box == (10, 20, 110, 40) and doc.page_sizes == []
    # Document.to_dict() output: 0-1000 boxes even though page_sizes is there
    saved = {
        "id": "d",
        "words": [{"text": "x", "box": [1, 2, 3, 4], "page": 0}],
        "page_sizes": [[50, 50]],
        "normalized": True,
    }
    assert load_document(json.dumps(saved).encode(), filename="d.json").words[0].box == (1, 2, 3, 4)
    # a .txt holding such JSON is read as words too
    assert load_document(json.dumps(words).encode(), filename="w.txt").words[0].text == "Total"
    for bad, msg in [
        (b"{not json", "not valid JSON"),
        (b'{"pages": []}', '"words" list'),
        (b'{"words": [{"text": "a", "box": [1, 2, 3]}]}', r"words\[0\]: box must be"),
        (b'{"words": [{"text": "a", "box": [1, 2, 3000, 4]}]}', "give page_sizes"),
        (b'{"words": [{"text": "a", "box": [1, 2, 3, 4], "page": 1}], "page_sizes": [[9, 9]]}', "not a page"),
        (b'{"words": [], "page_sizes": [[0, 9]]}', "positive"),
    ]:
        with pytest.raises(DocumentError, match=msg):
            load_document(bad, filename="bad.json")


def test_text_inputs(tmp_path):
    doc = load_document(text="Invoice 12\nTotal: 9.90")
    assert doc.text == "Invoice 12\nTotal: 9.90" and serialize(doc) == doc.text and doc.words == []
    path = tmp_path / "letter.txt"
    path.write_text("Dear Sir,\n1, 2, 3 apples cost 4.50.\n")
    doc = load_document(path)
    assert doc.id == "letter" and doc.text.startswith("Dear Sir")
    assert load_document(b"Total 5.00", content_type="text/plain").text == "Total 5.00"
    # an entities-like JSON in a .txt is text, not words
    assert load_document(b'{"total": "9.90"}', filename="entities.txt").text == '{"total": "9.90"}'


# ---- limits, cancellation, error codes ----------------------------------------------------------
def png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height in its header, with no pixel data (it cannot be decoded)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_pixel_limit_is_checked_from_the_header(no_ocr):
    from pipkie.io.loaders import LimitExceeded

    with pytest.raises(
        LimitExceeded, match="huge.png: image is 12000x12000 = 144,000,000 pixels, more than the limit of 40,000,000"
    ) as e:
        load_document(png_header(12000, 12000), filename="huge.png")  # would not even decode
    assert e.value.code == "too_many_pixels" and "huge.png" not in e.value.reason
    with pytest.raises(LimitExceeded, match="more than the limit of 100"):
        load_document(png_header(20, 20), filename="small.png", max_pixels=100)
    # above Pillow's own bomb limit with ours lifted: still a limit, not a corrupt file
    with pytest.raises(LimitExceeded, match="too large") as e:
        load_document(png_header(20000, 20000), filename="bomb.png", max_pixels=None)
    assert e.value.code == "too_many_pixels"


def test_each_tiff_frame_is_checked_before_it_is_decoded(fake_ocr, tmp_path):
    from pipkie.io.loaders import LimitExceeded

    frames = [Image.new("L", (100, 100), 255), Image.new("L", (400, 400), 255)]
    path = tmp_path / "mixed.tiff"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    with pytest.raises(LimitExceeded, match="400x400"):
        load_document(path, max_pixels=50_000)
    assert fake_ocr.sizes == [(100, 100)]  # the first page was fine, the second never decoded


def test_word_limit_in_every_form(fake_ocr):
    from pipkie.io.loaders import LimitExceeded

    words = {"words": [{"text": f"w{i}", "box": [0, 0, 1, 1]} for i in range(6)]}
    pdf = make_text_pdf([[(72, 700, 10, "a b c")], [(72, 700, 10, "d e f")]])
    box = b"".join(b"1,1,9,1,9,9,1,9,w%d\n" % i for i in range(6))
    tiff = io.BytesIO()
    Image.new("RGB", (20, 20)).save(tiff, "TIFF", save_all=True, append_images=[Image.new("RGB", (20, 20))] * 5)
    for data, name in [
        (json.dumps(words).encode(), "w.json"),
        (pdf, "p.pdf"),
        (box, "b.txt"),
        (b"one two three four five six", "t.txt"),
        (tiff.getvalue(), "s.tiff"),
    ]:
        with pytest.raises(LimitExceeded, match=f"{name}: 6 words, more than the limit of 5") as e:
            load_document(data, filename=name, max_words=5)
        assert e.value.code == "too_many_words"
        load_document(data, filename=name, max_words=6)
    with pytest.raises(LimitExceeded, match="2 words"):
        load_document(text="two words", max_words=1)


def test_a_set_cancel_event_stops_between_pages(no_ocr):
    import threading

    from pipkie.io.loaders import LoadCancelled

    cancel = threading.Event()
    pdf = make_text_pdf([[(72, 700, 12, "a")], [(72, 700, 12, "b")]])
    assert len(load_document(pdf, filename="two.pdf", cancel=cancel).words) == 2
    cancel.set()
    with pytest.raises(LoadCancelled):
        load_document(pdf, filename="two.pdf", cancel=cancel)


def test_errors_carry_a_code_a_reason_and_the_decoders_detail(fake_ocr):
    with pytest.raises(DocumentError) as e:
        load_document(b"\x89PNG\r\n\x1a\ngarbage", filename="x.png")
    assert e.value.code == "unreadable_document" and e.value.reason == "not a readable image"
    assert e.value.detail and str(e.value) == f"x.png: not a readable image ({e.value.detail})"
    with pytest.raises(DocumentError) as e:
        load_document(b"\x00\x9f\x92\x96 binary", filename="blob.bin")
    assert e.value.code == "unsupported_type" and e.value.detail is None
    with pytest.raises(DocumentError) as e:
        load_document(b"", filename="e.txt")
    assert e.value.code == "empty_document"


@pytest.mark.parametrize(
    "box",
    [
        "[NaN, 0, 1, 1]",
        "[Infinity, 0, 1, 1]",
        "[1e999, 0, 1, 1]",
        f"[{10**400}, 0, 1, 1]",
        "[true, 0, 1, 1]",
        '["1", 0, 1, 1]',
    ],
)
def test_json_words_refuse_non_numbers(box):
    data = b'{"words": [{"text": "x", "box": %s}], "page_sizes": [[100, 100]]}' % box.encode()
    with pytest.raises(DocumentError, match="box must be") as e:
        load_document(data, filename="w.json")
    assert e.value.code == "invalid_words"


def test_json_words_pages_are_limited():
    from pipkie.io.loaders import LimitExceeded, words_document

    obj = {"words": [{"text": "x", "box": [0, 0, 1, 1], "page": 4}]}
    with pytest.raises(LimitExceeded, match="5 pages, more than the limit of 3"):
        words_document(obj, max_pages=3)
    with pytest.raises(DocumentError, match="page_sizes"):
        words_document({"words": [], "page_sizes": [[1e999, 5]]})
    assert words_document(obj, "d", max_pages=5).words[0].page == 4
