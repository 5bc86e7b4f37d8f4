"""Turn a user's file into a `Document`: images and scans are OCR'd, PDFs read, OCR output parsed.

    doc = load_document("receipt.jpg")                         # OCR (rapidocr, 1 thread)
    doc = load_document("contract.pdf", max_pages=50)          # text layer, else render + OCR
    doc = load_document(data, filename="upload.png")           # bytes, e.g. from an HTTP upload
    doc = load_document(text="Invoice 12 ... Total 9.90")      # plain text

What a source is comes from its bytes first (PDF, PNG, JPEG, TIFF, GIF, BMP, WebP signatures), then
from its name or content type, then from its content:

- images: every page (all frames of a multi-page TIFF) is OCR'd. `images[i]` is the file of page i
  (the same TIFF for all its frames); `page_sizes` are the pixel sizes (EXIF-upright).
- PDF (pypdfium2): a page with a text layer gives its words and char boxes directly (no OCR; boxes
  follow the page's /Rotate); a page without one is rendered at `dpi` (200) and OCR'd. `page_sizes` are pixels at `dpi`
  for every page, so they match `render_pdf_page`.
- SROIE box files (`x1,y1,...,x4,y4,text` on the first line and on 80 % of the lines): the words,
  in pixels of the receipt image. The page size comes from `../images.jsonl` or `../img/{id}.jpg`
  beside a `box/` folder when there is one (then `images` names that image), else from the boxes'
  extent.
- JSON words (a .json name or JSON content type, or any text that is such an object):
  `{"words": [{"text": str, "box": [x0, y0, x1, y1] or 8 corner coordinates,
  "page": int (optional, 0)}], "page_sizes": [[w, h], ...] (optional), "id": str (optional)}`.
  With `page_sizes`, boxes are in pixels of their page and are normalised here; without it they
  must already be 0-1000. `"normalized": true` says boxes are 0-1000 even though page_sizes is
  given (as in `Document.to_dict()` output).
- anything else that decodes as UTF-8 text: `Document(text=...)`.

Every failure on the input (corrupt, unsupported, empty, too many pages) raises `DocumentError`,
a `ValueError` that names the file. A missing OCR engine raises `pipkie.ocr.OCREngineError`.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
from pathlib import Path
from typing import Union

from PIL import Image, ImageSequence

from pipkie.data.errors import DataError
from pipkie.data.sroie import read_box_file
from pipkie.document import Document, Word, normalize_box
from pipkie.ocr import OCREngineError, OCRError, get_engine, load_image, to_words

Source = Union[str, Path, bytes, None]

MAX_RENDER_SIDE = 4000  # pixels; a huge PDF page is rendered at a lower dpi rather than exhaust memory

_SIGNATURES = [
    (b"%PDF-", "pdf"),
    (b"\x89PNG\r\n\x1a\n", "image"),
    (b"\xff\xd8\xff", "image"),
    (b"II*\x00", "image"),
    (b"MM\x00*", "image"),
    (b"GIF87a", "image"),
    (b"GIF89a", "image"),
]
_IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp", ".webp"}
_BOX_LINE = re.compile(r"^\s*-?\d+(\.\d+)?(\s*,\s*-?\d+(\.\d+)?){7}\s*,")


class DocumentError(DataError):
    """A source could not be turned into a Document; the message starts with the file's name."""


def load_document(
    source: Source = None,
    *,
    filename: str | None = None,
    content_type: str | None = None,
    text: str | None = None,
    ocr: str = "rapidocr",
    threads: int = 1,
    max_pages: int = 20,
    dpi: int = 200,
    pdf_text: bool = True,
) -> Document:
    """A Document from a path, from bytes (name them with `filename` / `content_type`), or from `text`.

    ocr/threads choose the OCR engine (`pipkie.ocr.get_engine`); pdf_text=False OCRs PDF pages even
    when they have a text layer. More than `max_pages` pages raises DocumentError.
    """
    if text is not None:
        return Document(id=Path(filename).stem if filename else "text", text=text)
    if source is None:
        raise TypeError("load_document needs a source (path or bytes) or text=")
    path = None
    if isinstance(source, (str, Path)):
        path = Path(source)
        name = str(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise DocumentError(name, f"cannot read file ({e.strerror or e})") from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        name = filename or "<upload>"
    else:
        raise TypeError(f"source must be a path or bytes, not {type(source).__name__}")
    if not data:
        raise DocumentError(name, "file is empty")
    doc_id = Path(filename or name).stem if (filename or path) else "document"
    kind = _sniff(data, filename or name, content_type)
    try:
        if kind == "image":
            return _load_image(data, doc_id, path, name, ocr, threads, max_pages)
        if kind == "pdf":
            return _load_pdf(data, doc_id, name, ocr, threads, max_pages, dpi, pdf_text)
        return _load_textual(data, doc_id, path, name, kind)
    except (DocumentError, OCREngineError):
        raise
    except OCRError as e:  # its message starts with the image's name: keep the reason only
        raise DocumentError(name, str(e).split(": ", 1)[-1]) from e
    except DataError as e:  # from read_box_file: keep the line number, name the user's file
        where = f"{e.path}:{e.line}" if e.line is not None else str(e.path)
        raise DocumentError(name, str(e).removeprefix(where + ": "), line=e.line) from e
    except Exception as e:  # untrusted input: any parser failure is the file's fault, not a crash
        raise DocumentError(name, f"cannot read {kind} ({type(e).__name__}: {e})") from e


def _sniff(data: bytes, name: str, content_type: str | None) -> str:
    """'pdf', 'image', 'json' or 'text' (box files and plain text are told apart later)."""
    for magic, kind in _SIGNATURES:
        if data.startswith(magic):
            return kind
    if b"%PDF-" in data[:1024]:  # readers accept junk before the header
        return "pdf"
    if (data[:4] == b"RIFF" and data[8:12] == b"WEBP") or (data[:2] == b"BM" and data[6:10] == bytes(4)):
        return "image"  # WebP; BMP (its reserved header bytes are zero, unlike text starting "BM")
    ext = Path(name).suffix.lower()
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ext == ".pdf" or ctype == "application/pdf":
        raise DocumentError(name, "not a PDF (no %PDF- header)")
    if ext in _IMAGE_EXTS or ctype.startswith("image/"):
        raise DocumentError(name, "not a readable image (unknown or corrupt image data)")
    if ext == ".json" or ctype == "application/json":
        return "json"
    return "text"


def _check_pages(n: int, max_pages: int, name: str) -> None:
    if n == 0:
        raise DocumentError(name, "document has no pages")
    if n > max_pages:
        raise DocumentError(name, f"{n} pages, more than the limit of {max_pages}")


def _load_image(data: bytes, doc_id: str, path: Path | None, name: str, ocr: str, threads: int, max_pages: int) -> Document:
    try:
        im = Image.open(io.BytesIO(data))
    except Exception as e:
        raise DocumentError(name, f"not a readable image ({e})") from e
    _check_pages(getattr(im, "n_frames", 1), max_pages, name)
    engine = get_engine(ocr, threads)
    words: list[Word] = []
    sizes: list[tuple[int, int]] = []
    for page, frame in enumerate(ImageSequence.Iterator(im)):
        page_im = load_image(frame)
        words += to_words(engine(page_im), page_im.size, page)
        sizes.append(page_im.size)
    images = [str(path)] * len(sizes) if path else []
    return Document(id=doc_id, words=words, page_sizes=sizes, images=images)


def _load_pdf(data: bytes, doc_id: str, name: str, ocr: str, threads: int, max_pages: int, dpi: int, pdf_text: bool) -> Document:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        raise DocumentError(name, f"not a readable PDF ({e})") from e
    try:
        _check_pages(len(pdf), max_pages, name)
        words: list[Word] = []
        sizes: list[tuple[int, int]] = []
        for i in range(len(pdf)):
            page = pdf[i]
            w_pt, h_pt = page.get_size()
            scale = min(dpi / 72, MAX_RENDER_SIDE / max(w_pt, h_pt, 1))
            sizes.append((max(1, round(w_pt * scale)), max(1, round(h_pt * scale))))
            page_words = pdf_text_words(page, i) if pdf_text else []
            if not page_words:
                image = page.render(scale=scale).to_pil()
                page_words = to_words(get_engine(ocr, threads)(image), image.size, i)
            words += page_words
        return Document(id=doc_id, words=words, page_sizes=sizes)
    finally:
        pdf.close()


def pdf_text_words(page, page_index: int = 0) -> list[Word]:
    """Words of a pypdfium2 page's text layer (chars split at whitespace, gaps and line jumps), with
    0-1000 boxes on the page as displayed (its /Rotate and crop box applied, as when rendered)."""
    import pypdfium2.raw as raw

    width, height = page.get_size()  # as displayed, i.e. after rotation
    rot = page.get_rotation() % 360
    left0, bottom0, right0, top0 = page.get_cropbox()
    w_pt, h_pt = right0 - left0, top0 - bottom0  # unrotated

    def shown(x: float, y: float) -> tuple[float, float]:
        """PDF user space (bottom-left origin, unrotated) -> displayed page (top-left origin)."""
        x, y = x - left0, y - bottom0
        if rot == 90:
            return y, x
        if rot == 180:
            return w_pt - x, y
        if rot == 270:
            return h_pt - y, w_pt - x
        return x, h_pt - y

    textpage = page.get_textpage()
    try:
        words: list[Word] = []
        chars: list[str] = []
        box: list[float] = []

        def flush():
            if chars and "".join(chars).strip():
                x0, y0, x1, y1 = box
                corners = [*shown(x0, y0), *shown(x1, y1)]
                words.append(Word("".join(chars), normalize_box(corners, width, height), page_index))
            chars.clear()
            box.clear()

        for i in range(textpage.count_chars()):
            ch = chr(raw.FPDFText_GetUnicode(textpage.raw, i) or 32)
            if ch.isspace() or ch in "\x00\ufffe\uffff":
                flush()
                continue
            left, bottom, right, top = textpage.get_charbox(i, loose=True)
            if box:
                mid, size = (bottom + top) / 2, max(top - bottom, box[3] - box[1], 1e-6)
                new_line = abs(mid - (box[1] + box[3]) / 2) > 0.5 * size
                if new_line or left < box[0] - 0.5 * size or left > box[2] + size:
                    flush()
            chars.append(ch)
            box[:] = [left, bottom, right, top] if not box else [
                min(box[0], left), min(box[1], bottom), max(box[2], right), max(box[3], top)
            ]
        flush()
        return words
    finally:
        textpage.close()


def render_pdf_page(source: str | Path | bytes, page: int = 0, size: tuple[int, int] | None = None, dpi: int = 200) -> Image.Image:
    """A PDF page as a PIL image, at `size` pixels (e.g. the Document's page_sizes[page]) or at `dpi`."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(source if isinstance(source, bytes) else str(source))
    try:
        p = pdf[page]
        w_pt, _ = p.get_size()
        scale = size[0] / w_pt if size else min(dpi / 72, MAX_RENDER_SIDE / max(p.get_size()))
        return p.render(scale=scale).to_pil().convert("RGB")
    finally:
        pdf.close()


def _load_textual(data: bytes, doc_id: str, path: Path | None, name: str, kind: str) -> Document:
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(name, "unsupported file type (not a PDF, an image, JSON or UTF-8 text)") from None
    if "\x00" in content:
        raise DocumentError(name, "unsupported binary file")
    if kind == "json" or (content.lstrip().startswith("{") and _is_words_json(content)):
        return _load_json_words(content, doc_id, name)
    lines = [line for line in content.splitlines() if line.strip()]
    # a box file: its first line and nearly all others look like boxes (read_box_file reports the rest)
    if lines and _BOX_LINE.match(lines[0]) and sum(bool(_BOX_LINE.match(x)) for x in lines) >= 0.8 * len(lines):
        return _load_box_file(content, doc_id, path)
    if not content.strip():
        raise DocumentError(name, "file has no text")
    return Document(id=doc_id, text=content)


def _load_box_file(content: str, doc_id: str, path: Path | None) -> Document:
    size, image = _sroie_page(path) if path else (None, None)
    if path is not None:
        words, page = read_box_file(path, *(size or (None, None)))
    else:  # read_box_file reads a path; bytes go through a temporary file
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp) / f"{doc_id}.txt"
            tmp_path.write_text(content, encoding="utf-8")
            words, page = read_box_file(tmp_path)
    return Document(id=doc_id, words=words, page_sizes=[page], images=[str(image)] if image else [])


def _sroie_page(box_path: Path) -> tuple[tuple[int, int] | None, Path | None]:
    """Page size and image of a box file in SROIE's layout ({split}/box/{id}.txt), when present."""
    split = box_path.parent.parent
    image = split / "img" / f"{box_path.stem}.jpg"
    image = image if box_path.parent.name == "box" and image.exists() else None
    meta = split / "images.jsonl"
    if box_path.parent.name == "box" and meta.exists():
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                m = json.loads(line)
                if m.get("id") == box_path.stem:
                    return (int(m["width"]), int(m["height"])), image
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    if image is not None:
        with Image.open(image) as im:
            return im.size, image
    return None, None


def _is_words_json(content: str) -> bool:
    try:
        obj = json.loads(content)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("words"), list)


def _load_json_words(content: str, doc_id: str, name: str) -> Document:
    try:
        obj = json.loads(content)
    except json.JSONDecodeError as e:
        raise DocumentError(name, f"not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("words"), list):
        raise DocumentError(name, 'expected a JSON object with a "words" list')
    sizes = obj.get("page_sizes")
    pixels = bool(sizes) and not obj.get("normalized", False)
    try:
        page_sizes = [(int(w), int(h)) for w, h in sizes] if sizes else []
    except (TypeError, ValueError):
        raise DocumentError(name, "page_sizes must be a list of [width, height]") from None
    if any(w <= 0 or h <= 0 for w, h in page_sizes):
        raise DocumentError(name, "page sizes must be positive")
    words = []
    for i, w in enumerate(obj["words"]):
        where = f"words[{i}]"
        if not isinstance(w, dict) or not isinstance(w.get("text"), str):
            raise DocumentError(name, f'{where}: expected {{"text": str, "box": [...]}}')
        box, page = w.get("box"), w.get("page", 0)
        if not isinstance(box, list) or len(box) not in (4, 8) or not all(isinstance(v, (int, float)) for v in box):
            raise DocumentError(name, f"{where}: box must be 4 numbers [x0, y0, x1, y1] or 8 corner coordinates")
        if not isinstance(page, int) or page < 0 or (page_sizes and page >= len(page_sizes)):
            raise DocumentError(name, f"{where}: page {page!r} is not a page of the document")
        if not w["text"].strip():
            continue
        if pixels:
            nbox = normalize_box(box, *page_sizes[page])
        else:
            if min(box) < 0 or max(box) > 1000:
                raise DocumentError(name, f"{where}: box {box} is not 0-1000; give page_sizes for pixel boxes")
            nbox = normalize_box(box, 1000, 1000)
        words.append(Word(w["text"], nbox, page))
    return Document(id=str(obj.get("id", doc_id)), words=words, page_sizes=page_sizes)
