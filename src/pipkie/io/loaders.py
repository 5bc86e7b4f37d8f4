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
  follow the page's /Rotate); a page without one is rendered at `dpi` (200) and OCR'd.
  `page_sizes` are pixels at `dpi` for every page, so they match `render_pdf_page`.
- SROIE box files (`x1,y1,...,x4,y4,text` on the first line and on 80 % of the lines): the words,
  in pixels of the receipt image. The page size comes from `../images.jsonl` or `../img/{id}.jpg`
  beside a `box/` folder when there is one (then `images` names that image), else from the boxes'
  extent.
- JSON words (a .json name or JSON content type, or any text that is such an object):
  `{"words": [{"text": str, "box": [x0, y0, x1, y1] or 8 corner coordinates,
  "page": int (optional, 0), "line": int (optional: the OCR engine's text line, kept whole by the
  reading order)}], "page_sizes": [[w, h], ...] (optional), "id": str (optional)}`.
  With `page_sizes`, boxes are in pixels of their page and are normalised here; without it they
  must already be 0-1000. `"normalized": true` says boxes are 0-1000 even though page_sizes is
  given (as in `Document.to_dict()` output).
- anything else that decodes as UTF-8 text: `Document(text=...)`.

Failures on the input raise `DocumentError` (a ValueError naming the file; a stable `code`, a
`reason` fit for a client, the decoder's `detail` for logs); its subclass `LimitExceeded` for more
than `max_pages` pages (PDF pages, image frames), a page over `max_pixels` (from the header,
before decoding) or more than `max_words` words (before building JSON words, after each page).
`cancel` (a threading.Event, set by the service when a request is gone) stops a load between pages
with `LoadCancelled`. A missing OCR engine raises `pipkie.io.ocr.OCREngineError`.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
import threading
from pathlib import Path
from typing import Union

from PIL import Image, ImageSequence

from pipkie.data.errors import DataError
from pipkie.data.sroie import read_box_file
from pipkie.io.document import Document, Word, normalize_box
from pipkie.io.ocr import (
    MAX_PIXELS,
    ImageTooLarge,
    OCREngineError,
    OCRError,
    check_pixels,
    get_engine,
    load_image,
    to_words,
)
from pipkie.io.pdf import MAX_RENDER_SIDE, PDFIUM, pdf_text_words, render_page

Source = Union[str, Path, bytes, None]


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
    """A source could not be turned into a Document; the message starts with the file's name.

    code: stable name of what went wrong ("unreadable_document", "unsupported_type",
    "empty_document", "invalid_words", or a limit's code); reason: the message without the file's
    name and without `detail`, the decoder library's own words (which end the message when given).
    """

    def __init__(
        self,
        path,
        reason: str,
        line: int | None = None,
        *,
        detail: str | None = None,
        code: str = "unreadable_document",
    ):
        super().__init__(path, reason + (f" ({detail})" if detail else ""), line)
        self.reason, self.detail, self.code = reason, detail, code


class LimitExceeded(DocumentError):
    """The document is over a limit: code "too_many_pages", "too_many_pixels" or "too_many_words"."""


class LoadCancelled(Exception):
    """The load was cancelled between pages (its `cancel` event was set)."""


def _check_words(n: int, max_words: int | None, name: str) -> None:
    if max_words is not None and n > max_words:
        raise LimitExceeded(name, f"{n:,} words, more than the limit of {max_words:,}", code="too_many_words")


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise LoadCancelled()


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
    max_pixels: int | None = MAX_PIXELS,
    max_words: int | None = None,
    cancel: threading.Event | None = None,
) -> Document:
    """A Document from a path, from bytes (name them with `filename` / `content_type`), or from `text`.

    ocr/threads choose the OCR engine (`pipkie.io.ocr.get_engine`); pdf_text=False OCRs PDF pages even
    when they have a text layer. More than `max_pages` pages, a page of more than `max_pixels`
    pixels or more than `max_words` words (None: no limit) raise LimitExceeded; a set `cancel`
    event raises LoadCancelled at the next page.
    """
    limits = {"max_pages": max_pages, "max_pixels": max_pixels, "max_words": max_words, "cancel": cancel}
    if text is not None:
        _check_words(len(text.split()), max_words, filename or "text")
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
        raise DocumentError(name, "file is empty", code="empty_document")
    doc_id = Path(filename or name).stem if (filename or path) else "document"
    kind = sniff(data, filename or name, content_type)
    try:
        if kind == "image":
            return _load_image(data, doc_id, path, name, ocr, threads, limits)
        if kind == "pdf":
            return _load_pdf(data, doc_id, name, ocr, threads, dpi, pdf_text, limits)
        return _load_textual(data, doc_id, path, name, kind, limits)
    except (DocumentError, OCREngineError, LoadCancelled):
        raise
    except ImageTooLarge as e:
        raise LimitExceeded(name, e.reason, detail=e.detail, code="too_many_pixels") from e
    except OCRError as e:  # its message starts with the image's name: keep the reason only
        raise DocumentError(name, e.reason, detail=e.detail) from e
    except DataError as e:  # from read_box_file: keep the line number, name the user's file
        where = f"{e.path}:{e.line}" if e.line is not None else str(e.path)
        raise DocumentError(name, str(e).removeprefix(where + ": "), line=e.line) from e
    except Exception as e:  # untrusted input: any parser failure is the file's fault, not a crash
        raise DocumentError(name, f"cannot read {kind}", detail=f"{type(e).__name__}: {e}") from e


def sniff(data: bytes, name: str = "<upload>", content_type: str | None = None) -> str:
    """What `load_document` takes `data` for: 'pdf', 'image', 'json' or 'text' (box files and plain
    text are told apart later); DocumentError when the name or type promises a PDF or an image that
    the bytes are not. Cheap (signatures only): the service sizes its work by it."""
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
        raise DocumentError(name, "not a readable image", detail="unknown or corrupt image data")
    if ext == ".json" or ctype == "application/json":
        return "json"
    return "text"


def _check_pages(n: int, max_pages: int, name: str) -> None:
    if n == 0:
        raise DocumentError(name, "document has no pages", code="empty_document")
    if n > max_pages:
        raise LimitExceeded(name, f"{n} pages, more than the limit of {max_pages}", code="too_many_pages")


def _load_image(
    data: bytes, doc_id: str, path: Path | None, name: str, ocr: str, threads: int, limits: dict
) -> Document:
    try:
        im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:  # Pillow's own limit, above ours
        raise LimitExceeded(name, "image is too large", detail=str(e), code="too_many_pixels") from e
    except Exception as e:
        raise DocumentError(name, "not a readable image", detail=str(e)) from e
    _check_pages(getattr(im, "n_frames", 1), limits["max_pages"], name)
    words: list[Word] = []
    sizes: list[tuple[int, int]] = []
    for page, frame in enumerate(ImageSequence.Iterator(im)):
        _check_cancel(limits["cancel"])
        check_pixels(frame.size, limits["max_pixels"], name)  # this frame's header only: nothing decoded
        page_im = load_image(frame, limits["max_pixels"])
        words += to_words(get_engine(ocr, threads)(page_im), page_im.size, page)
        sizes.append(page_im.size)
        _check_words(len(words), limits["max_words"], name)
    images = [str(path)] * len(sizes) if path else []
    return Document(id=doc_id, words=words, page_sizes=sizes, images=images)


def _load_pdf(
    data: bytes, doc_id: str, name: str, ocr: str, threads: int, dpi: int, pdf_text: bool, limits: dict
) -> Document:
    import pypdfium2 as pdfium

    with PDFIUM:  # pdfium is not thread-safe (pipkie.io.pdf); the OCR of a page runs outside the lock
        try:
            pdf = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as e:
            raise DocumentError(name, "not a readable PDF", detail=str(e)) from e
    try:
        with PDFIUM:
            n_pages = len(pdf)
        _check_pages(n_pages, limits["max_pages"], name)
        words: list[Word] = []
        sizes: list[tuple[int, int]] = []
        for i in range(n_pages):
            _check_cancel(limits["cancel"])
            with PDFIUM:
                page = pdf[i]
                try:
                    w_pt, h_pt = page.get_size()
                    scale = min(dpi / 72, MAX_RENDER_SIDE / max(w_pt, h_pt, 1))  # at most MAX_RENDER_SIDE² pixels
                    sizes.append((max(1, round(w_pt * scale)), max(1, round(h_pt * scale))))
                    page_words = pdf_text_words(page, i) if pdf_text else []
                    image = None if page_words else render_page(page, scale)
                finally:
                    page.close()
            if image is not None:
                page_words = to_words(get_engine(ocr, threads)(image), image.size, i)
            words += page_words
            _check_words(len(words), limits["max_words"], name)
        return Document(id=doc_id, words=words, page_sizes=sizes)
    finally:
        with PDFIUM:
            pdf.close()


def _load_textual(data: bytes, doc_id: str, path: Path | None, name: str, kind: str, limits: dict) -> Document:
    max_words = limits["max_words"]
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(
            name, "unsupported file type (not a PDF, an image, JSON or UTF-8 text)", code="unsupported_type"
        ) from None
    if "\x00" in content:
        raise DocumentError(name, "unsupported binary file", code="unsupported_type")
    if kind == "json" or (content.lstrip().startswith("{") and _is_words_json(content)):
        return _load_json_words(content, doc_id, name, max_words, limits["max_pages"])
    lines = [line for line in content.splitlines() if line.strip()]
    # a box file: its first line and nearly all others look like boxes (read_box_file reports the rest)
    if lines and _BOX_LINE.match(lines[0]) and sum(bool(_BOX_LINE.match(x)) for x in lines) >= 0.8 * len(lines):
        _check_words(len(lines), max_words, name)
        return _load_box_file(content, doc_id, path)
    if not content.strip():
        raise DocumentError(name, "file has no text", code="empty_document")
    _check_words(len(content.split()), max_words, name)
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


def _is_coordinate(v) -> bool:
    """A finite number of sane size (JSON allows NaN, Infinity and 400-digit integers; booleans are not numbers)."""
    return type(v) in (int, float) and abs(v) < 1e9  # NaN and ±Infinity compare False


def _load_json_words(
    content: str, doc_id: str, name: str, max_words: int | None = None, max_pages: int | None = None
) -> Document:
    try:
        obj = json.loads(content)
    except json.JSONDecodeError as e:
        raise DocumentError(name, f"not valid JSON ({e.msg}, line {e.lineno})", code="invalid_words") from None
    return words_document(obj, doc_id, name, max_words, max_pages)


def words_document(
    obj, doc_id: str = "document", name: str = "<words>", max_words: int | None = None, max_pages: int | None = None
) -> Document:
    """A Document from parsed JSON words (the format in the module docstring; `doc_id` unless it
    has an "id"); DocumentError naming `name` and the word at fault, LimitExceeded over a limit."""
    if not isinstance(obj, dict) or not isinstance(obj.get("words"), list):
        raise DocumentError(name, 'expected a JSON object with a "words" list', code="invalid_words")
    _check_words(len(obj["words"]), max_words, name)
    sizes = obj.get("page_sizes")
    pixels = bool(sizes) and not obj.get("normalized", False)
    try:
        page_sizes = [(int(w), int(h)) for w, h in sizes] if sizes else []
    except (TypeError, ValueError, OverflowError):
        raise DocumentError(name, "page_sizes must be a list of [width, height]", code="invalid_words") from None
    if any(w <= 0 or h <= 0 for w, h in page_sizes):
        raise DocumentError(name, "page sizes must be positive", code="invalid_words")
    pages = max(
        [len(page_sizes)]
        + [w.get("page", 0) + 1 for w in obj["words"] if isinstance(w, dict) and type(w.get("page", 0)) is int]
    )
    if max_pages is not None and pages > max_pages:
        raise LimitExceeded(name, f"{pages} pages, more than the limit of {max_pages}", code="too_many_pages")
    words = []
    for i, w in enumerate(obj["words"]):
        where = f"words[{i}]"
        if not isinstance(w, dict) or not isinstance(w.get("text"), str):
            raise DocumentError(name, f'{where}: expected {{"text": str, "box": [...]}}', code="invalid_words")
        box, page = w.get("box"), w.get("page", 0)
        if not isinstance(box, list) or len(box) not in (4, 8) or not all(_is_coordinate(v) for v in box):
            raise DocumentError(
                name, f"{where}: box must be 4 numbers [x0, y0, x1, y1] or 8 corner coordinates", code="invalid_words"
            )
        if type(page) is not int or page < 0 or (page_sizes and page >= len(page_sizes)):
            raise DocumentError(name, f"{where}: page {page!r} is not a page of the document", code="invalid_words")
        if not w["text"].strip():
            continue
        if pixels:
            nbox = normalize_box(box, *page_sizes[page])
        else:
            if min(box) < 0 or max(box) > 1000:
                raise DocumentError(
                    name, f"{where}: box {box} is not 0-1000; give page_sizes for pixel boxes", code="invalid_words"
                )
            nbox = normalize_box(box, 1000, 1000)
        line = w.get("line", -1)  # the OCR engine's text line, when the words came from one (`pipkie ocr`)
        words.append(Word(w["text"], nbox, page, line if type(line) is int and line >= 0 else -1))
    return Document(id=str(obj.get("id", doc_id)), words=words, page_sizes=page_sizes)
