"""POST /render: one page of an uploaded document as a PNG, so that the web page draws what was read.

The boxes of an extraction are relative to the page as the loaders read it (0-1 of its width and
height: an image EXIF-upright, a TIFF frame, a PDF page with its /Rotate and crop box applied).
The web page needs that same page to draw them on, and a browser cannot show every such page
itself (TIFF, PDF, JSON words), so the service renders it, with the loaders' own code:

- image: frame `page`, through `pipkie.io.ocr.load_image` (EXIF-upright, RGB), as OCR saw it;
- PDF: page `page` rendered by pypdfium2 (its displayed size, as the loaders read it);
- JSON words / SROIE box file: a white page (its `page_sizes`, else A4 portrait) with each word
  written in its box, since there is no picture, only words and their places;
- plain text has no page: 422 `no_page_image`.

The image is scaled so that its longest side is at most `RENDER_SIDE` pixels (for a screen, not
for OCR). `X-Page-Count` says how many pages the document has. The limits of POST /extract apply
(body size, pages, pixels, words); a page that does not exist is 422 `page_out_of_range`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from fastapi import Request
from PIL import Image, ImageDraw, ImageFont

from pipkie.io.loaders import DocumentError, LimitExceeded, load_document, sniff
from pipkie.io.ocr import ImageTooLarge, OCRError, check_pixels, load_image
from pipkie.io.pdf import PDFIUM, render_page
from pipkie.serve.errors import ApiError
from pipkie.serve.parsing import (
    ENVELOPE_BYTES,
    UPLOAD_TYPES,
    document_error,
    invalid,
    read_body,
    replay,
)
from pipkie.serve.settings import ServeSettings

RENDER_SIDE = 1600  # longest side of a page image sent to the browser, pixels
WORDS_PAGE = (1000, 1414)  # a words document without page sizes is drawn on an A4-shaped page
PAGE_COUNT_HEADER = "X-Page-Count"


@dataclass
class Upload:
    """The document of a POST /render request and the page asked for (0-based)."""

    data: bytes
    name: str
    content_type: str | None
    page: int


@dataclass
class PageImage:
    png: bytes
    page: int
    pages: int


async def parse_render(request: Request, settings: ServeSettings) -> Upload:
    """The multipart form of POST /render: `file` (required) and `page` (an integer, default 0)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"unsupported content type {ctype[:100] or 'none'!r}: "
            "send multipart/form-data with the document as the form field 'file'",
        )
    body = await read_body(request, settings.max_body_bytes + ENVELOPE_BYTES, settings.max_upload_mb)
    try:
        form = await Request(request.scope, replay(body)).form(max_files=1, max_fields=2, max_part_size=1024 * 1024)
    except Exception:  # the multipart parser's errors (and its HTTPException for too many parts)
        raise ApiError(400, "malformed_body", "malformed multipart body") from None
    try:
        unknown = sorted(set(form.keys()) - {"file", "page"})
        if unknown:
            raise invalid(f"unknown form fields {[u[:64] for u in unknown[:8]]}; expected ['file', 'page']")
        upload, page = form.get("file"), form.get("page")
        if upload is None or isinstance(upload, str):
            raise invalid("no document: send it as a file upload in the form field 'file'")
        if page is not None and (not isinstance(page, str) or not page.strip().isdigit()):
            raise invalid("page must be a page number: 0, 1, 2, ... (0 is the first page)")
        file_type = (upload.content_type or "").split(";")[0].strip().lower()
        if file_type and not file_type.startswith(UPLOAD_TYPES):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"unsupported content type {file_type[:100]!r}: send an image, a PDF or JSON words",
            )
        data = await upload.read()
    finally:
        await form.close()
    if len(data) > settings.max_body_bytes:
        raise ApiError(413, "body_too_large", f"upload too large: the limit is {settings.max_upload_mb:g} MB")
    name = (upload.filename or "upload").replace("\\", "/").rsplit("/", 1)[-1][:200] or "upload"
    if not data:
        raise invalid(f"{name}: file is empty", "empty_document")
    return Upload(data, name, file_type or None, int(page) if page is not None else 0)


def render(upload: Upload, settings: ServeSettings) -> PageImage:
    """Render the page asked for (runs in the service's loader pool); ApiError on a bad document."""
    try:
        kind = sniff(upload.data, upload.name, upload.content_type)
        if kind == "image":
            image, pages = _image_page(upload, settings)
        elif kind == "pdf":
            image, pages = _pdf_page(upload, settings)
        else:
            image, pages = _words_page(upload, settings)
    except DocumentError as e:
        raise document_error(e) from None
    except ImageTooLarge as e:
        raise ApiError(413, "too_many_pixels", f"{upload.name}: {e.reason}") from None
    except OCRError as e:
        raise ApiError(422, "unreadable_document", f"{upload.name}: {e.reason}") from None
    except Exception:  # an untrusted file that a decoder choked on
        raise ApiError(422, "unreadable_document", f"{upload.name}: could not read the document") from None
    image.thumbnail((RENDER_SIDE, RENDER_SIDE))
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)  # fast: this is a preview, sent over localhost
    return PageImage(out.getvalue(), upload.page, pages)


def _check_page(upload: Upload, pages: int, settings: ServeSettings) -> None:
    if pages == 0:
        raise DocumentError(upload.name, "document has no pages", code="empty_document")
    if pages > settings.max_pages:
        raise LimitExceeded(
            upload.name, f"{pages} pages, more than the limit of {settings.max_pages}", code="too_many_pages"
        )
    if upload.page >= pages:
        raise DocumentError(
            upload.name,
            f"there is no page {upload.page}: the document has {pages} page{'s' if pages > 1 else ''} (0 is the first)",
            code="page_out_of_range",
        )


def _image_page(upload: Upload, settings: ServeSettings) -> tuple[Image.Image, int]:
    try:
        im = Image.open(io.BytesIO(upload.data))
    except Image.DecompressionBombError:
        raise LimitExceeded(upload.name, "image is too large", code="too_many_pixels") from None
    except Exception:
        raise DocumentError(upload.name, "not a readable image") from None
    pages = getattr(im, "n_frames", 1)
    _check_page(upload, pages, settings)
    im.seek(upload.page)
    check_pixels(im.size, settings.max_pixels, upload.name)  # the header only: nothing decoded yet
    return load_image(im, settings.max_pixels), pages


def _pdf_page(upload: Upload, settings: ServeSettings) -> tuple[Image.Image, int]:
    import pypdfium2 as pdfium

    with PDFIUM:  # pdfium is not thread-safe, and requests are served on several threads (pipkie.io.pdf)
        try:
            pdf = pdfium.PdfDocument(upload.data)
        except pdfium.PdfiumError:
            raise DocumentError(upload.name, "not a readable PDF") from None
        try:
            _check_page(upload, len(pdf), settings)
            page = pdf[upload.page]
            try:
                return render_page(page, RENDER_SIDE / max(*page.get_size(), 1)), len(pdf)
            finally:
                page.close()
        finally:
            pdf.close()


def _words_page(upload: Upload, settings: ServeSettings) -> tuple[Image.Image, int]:
    doc = load_document(
        upload.data,
        filename=upload.name,
        content_type=upload.content_type,
        max_pages=settings.max_pages,
        max_words=settings.max_words,
    )
    if not doc.words:
        raise DocumentError(
            upload.name, "a plain-text document has no page to show (only its fields)", code="no_page_image"
        )
    pages = max(len(doc.page_sizes), 1 + max(w.page for w in doc.words))
    _check_page(upload, pages, settings)
    w, h = doc.page_sizes[upload.page] if upload.page < len(doc.page_sizes) else WORDS_PAGE
    scale = RENDER_SIDE / max(w, h, 1)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    im = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(im)
    for word in doc.words:
        if word.page != upload.page:
            continue
        x0, y0, x1, y1 = (
            word.box[0] * size[0] / 1000,
            word.box[1] * size[1] / 1000,
            word.box[2] * size[0] / 1000,
            word.box[3] * size[1] / 1000,
        )
        draw.rectangle((x0, y0, x1, y1), outline=(210, 214, 220))
        font = ImageFont.load_default(size=max(6, min(48, round((y1 - y0) * 0.8))))
        width = draw.textlength(word.text, font=font)
        if width > x1 - x0 > 0:  # squeeze a long word into its box
            font = ImageFont.load_default(size=max(6, round(font.size * (x1 - x0) / width)))
        draw.text((x0, (y0 + y1) / 2), word.text, fill=(40, 44, 52), font=font, anchor="lm")
    return im, pages
