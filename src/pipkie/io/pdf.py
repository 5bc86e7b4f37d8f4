"""PDF pages with pypdfium2: the words of a page's text layer, and a page rendered as an image.

`pipkie.io.loaders` reads a born-digital PDF's text layer (`pdf_text_words`) and OCRs the pages
that have none; `pipkie.io.grounding` draws boxes on `render_pdf_page`.

PDFium is not thread-safe, not even on different documents (pypdfium2's docs: two calls at once
"would crash or corrupt the process"), and the service reads and renders PDFs on several threads at
once. So every pdfium call in pipkie holds `PDFIUM`, and every pdfium object (document, page, text
page, bitmap) is closed explicitly while it is held: left to the garbage collector, its close would
run on whichever thread collects it, outside the lock. Work that is not pdfium's (OCR of a rendered
page) runs outside it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PIL import Image

from pipkie.io.document import Word, normalize_box

MAX_RENDER_SIDE = 4000  # pixels; a huge PDF page is rendered at a lower dpi rather than exhaust memory
PDFIUM = threading.RLock()  # held by every pdfium call (see the module docstring)


def render_page(page, scale: float) -> Image.Image:
    """`page` rendered at `scale` as an RGB PIL image of its own (the bitmap is closed; call with
    `PDFIUM` held)."""
    bitmap = page.render(scale=scale)
    try:
        return bitmap.to_pil().convert("RGB")  # a copy: the bitmap's buffer is freed below
    finally:
        bitmap.close()


def pdf_text_words(page, page_index: int = 0) -> list[Word]:
    """Words of a pypdfium2 page's text layer (chars split at whitespace, gaps and line jumps), with
    0-1000 boxes on the page as displayed (its /Rotate and crop box applied, as when rendered); call
    with `PDFIUM` held."""
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
            box[:] = (
                [left, bottom, right, top]
                if not box
                else [min(box[0], left), min(box[1], bottom), max(box[2], right), max(box[3], top)]
            )
        flush()
        return words
    finally:
        textpage.close()


def render_pdf_page(
    source: str | Path | bytes, page: int = 0, size: tuple[int, int] | None = None, dpi: int = 200
) -> Image.Image:
    """A PDF page as a PIL image, at `size` pixels (e.g. the Document's page_sizes[page]) or at `dpi`."""
    import pypdfium2 as pdfium

    with PDFIUM:
        pdf = pdfium.PdfDocument(source if isinstance(source, bytes) else str(source))
        try:
            p = pdf[page]
            try:
                w_pt, _ = p.get_size()
                scale = size[0] / w_pt if size else min(dpi / 72, MAX_RENDER_SIDE / max(p.get_size()))
                return render_page(p, scale)
            finally:
                p.close()
        finally:
            pdf.close()
