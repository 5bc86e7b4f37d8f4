"""Heat maps of an `Explanation` (pipkie.explain) drawn on the document's page: where the value's
slots looked and where the copy head would start it, side by side (`pipkie explain --out`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

from pipkie.io.document import Document, Word

if TYPE_CHECKING:
    from pipkie.explain import Explanation

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp", ".webp", ".pdf"}
Weighted = list[tuple[Word, float]]


def page_image(doc: Document, page: int = 0, source: str | Path | Image.Image | None = None) -> Image.Image:
    """The page as an RGB image: the document's own image (`doc.images`), else `source` when it is an
    image or a PDF (or a PIL image), else a white page of the document's size with its words written
    in their boxes (for JSON words, box files without their image, text)."""
    from pipkie.io.grounding import _page_image

    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if page < len(doc.images) and doc.images[page] and Path(doc.images[page]).exists():
        return _page_image(doc, doc.images[page], page)
    if source is not None and Path(source).suffix.lower() in IMAGE_SUFFIXES and Path(source).exists():
        return _page_image(doc, source, page)
    return blank_page(doc, page)


def blank_page(doc: Document, page: int = 0) -> Image.Image:
    """A white page (the page's size, scaled to 1000-2000 px on its long side) with the words in grey."""
    w, h = doc.page_sizes[page] if page < len(doc.page_sizes) else (1000, 1000)
    scale = min(max(1.0, 1000 / max(w, h)), 2000 / max(w, h))
    im = Image.new("RGB", (max(1, round(w * scale)), max(1, round(h * scale))), "white")
    canvas = ImageDraw.Draw(im)
    sx, sy = im.width / 1000, im.height / 1000
    for word in doc.words:
        if word.page != page:
            continue
        x0, y0, x1, y1 = word.box
        size = max(8, int((y1 - y0) * sy * 0.8))
        canvas.text((x0 * sx, y0 * sy), word.text, fill="#555555", font=_font(size))
    return im


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType
        return ImageFont.load_default()


def _heat(r: float) -> tuple[int, int, int]:
    """0 -> pale yellow, 1 -> deep red."""
    stops = [(255, 237, 160), (254, 178, 76), (240, 59, 32), (165, 0, 38)]
    x = min(max(r, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    t = x - i
    return tuple(round(a + (b - a) * t) for a, b in zip(stops[i], stops[i + 1]))


def _panel(base: Image.Image, weighted: Weighted, page: int, top: int) -> Image.Image:
    """The page with each word coloured by its weight (relative to the page's heaviest) and the `top`
    heaviest outlined."""
    im = base.convert("RGBA")
    sx, sy = im.width / 1000, im.height / 1000
    overlay = Image.new("RGBA", im.size, (0, 0, 0, 0))
    canvas = ImageDraw.Draw(overlay)
    on_page = [(w, x) for w, x in weighted if w.page == page]
    peak = max((x for _, x in on_page), default=0.0) or 1.0
    for w, x in sorted(on_page, key=lambda wx: wx[1]):
        r = x / peak
        canvas.rectangle(
            (w.box[0] * sx, w.box[1] * sy, w.box[2] * sx, w.box[3] * sy),
            fill=(*_heat(r), round(40 + 170 * r**0.5)),
            outline=(120, 120, 120, 160),
            width=1,
        )
    line_w = max(2, im.width // 300)
    for w, _ in sorted(on_page, key=lambda wx: -wx[1])[:top]:
        canvas.rectangle(
            (w.box[0] * sx, w.box[1] * sy, w.box[2] * sx, w.box[3] * sy), outline=(165, 0, 38, 255), width=line_w
        )
    return Image.alpha_composite(im, overlay).convert("RGB")


def draw_heatmap(
    expl: Explanation,
    doc_or_source,
    out_path: str | Path,
    *,
    page: int | None = None,
    doc: Document | None = None,
    top: int = 5,
) -> Path:
    """Draw the page twice, side by side: words coloured by the copy head's start probability (what
    chose the value; only for a model with a copy head) and by the slots' attention (yellow = little,
    red = most, the `top` heaviest outlined), under a banner with the key, value and confidence;
    save to `out_path`.

    `doc_or_source`: the image/PDF path (or PIL image) of the page, or the Document itself (its
    image, else a drawn page). Pass `doc` too when the first argument is a path so the page size
    and images are known. `page`: default the page holding the most weight.
    """
    if isinstance(doc_or_source, Document):
        doc, source = doc_or_source, None
    else:
        source = doc_or_source
    doc = doc or Document(id=expl.document, words=[w for w, _ in expl.words])
    if page is None:
        pw = expl.page_weights()
        page = max(pw, key=pw.get) if pw else 0
    base = page_image(doc, page, source)
    where = (f", page {page + 1}" if len(doc.page_sizes) > 1 else "") + (
        f", {expl.truncated} tokens cut from the middle" if expl.truncated else ""
    )
    panels = [(f"attention of {expl.slots} slots ({expl.document_share:.0%} on the document){where}", expl.words)]
    if expl.copy_head:
        panels.insert(0, (f"copy head: where the value starts{where}", expl.starts))
    images = [_panel(base, weighted, page, top) for _, weighted in panels]
    gap = 12 if len(images) > 1 else 0
    width = sum(im.width for im in images) + gap * (len(images) - 1)

    font = _font(max(12, min(28, base.width // 45)))
    title = f"{expl.key} = {expl.value!r}  (confidence {expl.confidence:.2f})"
    probe = ImageDraw.Draw(base)
    line_h = max(probe.textbbox((0, 0), t, font=font)[3] for t in [title] + [c for c, _ in panels]) + 6
    bar_h = max(8, line_h // 2)
    top_h = line_h * 2 + bar_h + 16
    full = Image.new("RGB", (width, top_h + base.height), "white")
    canvas = ImageDraw.Draw(full)
    canvas.text((8, 4), title, fill="black", font=font)
    x = 0
    for (caption, _), im in zip(panels, images):
        canvas.text((x + 8, 4 + line_h), caption, fill="black", font=font)
        full.paste(im, (x, top_h))
        x += im.width + gap
    y, bar = line_h * 2 + 8, min(300, base.width - 16)
    for i in range(bar):
        canvas.line((8 + i, y, 8 + i, y + bar_h), fill=_heat(i / max(1, bar - 1)))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    full.save(out)
    return out
