"""Grounding: find the OCR words that hold an extracted value, and draw them on the page.

    words = ground("JALAN TAMPOI 7/4, JOHOR", doc)      # list[Word]; [] when nothing matches
    g = locate("$6.90", doc)                            # Grounding(words, score, method)
    results = ground_fields({"total": "6.90", "company": "..."}, doc)
    draw(doc, results, "receipt.jpg", "receipt.boxes.png")

Matching works on the words in reading order (`pipkie.io.reading_order.reading_order_lines`), and then in
the order the OCR gave them (which keeps a line whole when tall, overlapping boxes fool the
reading order), compared case-insensitively with all whitespace removed: a value may span words and
lines (an address over three lines returns the words of all three) and OCR spacing ("7/4,KAWASAN"
vs "7/4, KAWASAN") does not matter.

1. exact: the value is a substring of the words' text and neither end cuts a number or a word in
   two (so "6.90" is found in "RM6.90" or "$6.90" but not in "16.90"); the first such place wins.
   Score 1.0.
2. fuzzy (values of 4+ characters): rapidfuzz's best partial alignment of the value against the
   whole text, widened or narrowed to whole words by `fuzz.ratio` over the word windows around it.
   Score = that ratio / 100; below `threshold` (0.8) nothing is returned.

Line items (`ground_items`): a list's items come in line order, and the same price or name may be
printed on several lines, so each item is looked for from the line after the previous item's on
(its name first, else its first value found), and its other fields on its own line and the next
(`Name` / `2 @ 3.00   6.00`) before anywhere further down, then anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont, ImageOps
from rapidfuzz import fuzz

from pipkie.io.document import Document, Word, reading_order_lines

MIN_FUZZY_CHARS = 4
PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#008080", "#f032e6", "#9a6324"]


@dataclass
class Grounding:
    """Where a value was found: its words (reading order), a score 0-1, and how ('exact', 'fuzzy', 'none')."""

    words: list[Word] = field(default_factory=list)
    score: float = 0.0
    method: str = "none"

    def __bool__(self) -> bool:
        return bool(self.words)


def _key(text: str) -> str:
    return "".join(text.casefold().split())


class _Index:
    """The document's words in reading order as one whitespace-free string, with char -> word maps."""

    def __init__(self, words: list[Word]):
        self.words = [w for w in words if _key(w.text)]
        self.keys = [_key(w.text) for w in self.words]
        self.text = "".join(self.keys)
        self.owner: list[int] = []  # char position -> word index
        self.breaks: set[int] = set()  # char positions preceded by whitespace or a word boundary
        for i, w in enumerate(self.words):
            self.breaks.add(len(self.owner))
            for part in w.text.casefold().split():
                self.breaks.add(len(self.owner))
                self.owner.extend([i] * len(part))
        self.breaks.add(len(self.owner))

    def span_words(self, start: int, end: int) -> tuple[int, int]:
        """First and last word index covering chars [start, end)."""
        return self.owner[start], self.owner[end - 1]


def _cuts(a: str, b: str) -> bool:
    """True if a boundary between chars a|b splits a run of digits or of letters."""
    return (a.isdigit() and b.isdigit()) or (a.isalpha() and b.isalpha())


def _exact(value: str, index: _Index) -> Grounding | None:
    text, pos = index.text, index.text.find(value)
    while pos >= 0:
        end = pos + len(value)
        clean_start = pos in index.breaks or not _cuts(text[pos - 1], text[pos])
        clean_end = end in index.breaks or not _cuts(text[end - 1], text[end])
        if clean_start and clean_end:
            first, last = index.span_words(pos, end)
            return Grounding(index.words[first : last + 1], 1.0, "exact")
        pos = text.find(value, pos + 1)
    return None


def _fuzzy(value: str, index: _Index, threshold: float) -> Grounding | None:
    if len(value) < MIN_FUZZY_CHARS or not index.text:
        return None
    al = fuzz.partial_ratio_alignment(value, index.text, score_cutoff=threshold * 100 * 0.9)
    if al is None or al.dest_end <= al.dest_start:
        return None
    first, last = index.span_words(al.dest_start, al.dest_end)
    n = len(index.words)
    best: tuple[float, int, int, int] | None = None  # (score, -window length, i, j)
    for i in range(max(0, first - 2), min(n, first + 3)):
        for j in range(max(i, last - 2), min(n, last + 3)):
            score = fuzz.ratio(value, "".join(index.keys[i : j + 1]))
            cand = (score, -(j - i), i, j)
            if best is None or cand > best:
                best = cand
    if best is None or best[0] < threshold * 100:
        return None
    return Grounding(index.words[best[2] : best[3] + 1], best[0] / 100, "fuzzy")


def locate(value: str, doc: Document, threshold: float = 0.8) -> Grounding:
    """Where `value` is in `doc`'s words: exact match first, then fuzzy (score >= threshold, 0-1)."""
    v = _key(value or "")
    if not v or not doc.words:
        return Grounding()
    ordered = [w for line in reading_order_lines(doc.words) for w in line]
    indices = [_Index(ordered)] + ([_Index(doc.words)] if ordered != doc.words else [])
    for index in indices:
        if found := _exact(v, index):
            return found
    fuzzy = [g for g in (_fuzzy(v, index, threshold) for index in indices) if g]
    return max(fuzzy, key=lambda g: g.score) if fuzzy else Grounding()


def ground_items(
    items: list[dict[str, str | None]], doc: Document, threshold: float = 0.8, anchor: str = "name"
) -> list[dict[str, Grounding]]:
    """Per item, per field, where its value is (see the module docstring); the items in line order."""
    lines = reading_order_lines(doc.words)
    line_of = {id(w): i for i, line in enumerate(lines) for w in line}

    def within(lo: int, hi: int) -> Document:
        return Document(id=doc.id, words=[w for line in lines[lo:hi] for w in line])

    out, cursor = [], 0
    for item in items:
        order = sorted(item, key=lambda f: f != anchor)  # the anchor first, then the other fields
        found: dict[str, Grounding] = {}
        home = None
        for f in order:
            v = item[f]
            if v is None:
                found[f] = Grounding()
                continue
            places = ([(home, home + 2)] if home is not None else []) + [(cursor, len(lines)), (0, len(lines))]
            g = next((g for lo, hi in places if (g := locate(v, within(lo, hi), threshold))), Grounding())
            found[f] = g
            if home is None and g:
                home = line_of[id(g.words[0])]
        if home is not None:
            cursor = home + 1
        out.append({f: found[f] for f in item})
    return out


def ground(value: str, doc: Document, threshold: float = 0.8) -> list[Word]:
    """The words of `doc` that hold `value` (reading order), or [] when nothing matches well enough."""
    return locate(value, doc, threshold).words


def ground_fields(
    values: dict[str, str | Iterable[str] | None], doc: Document, threshold: float = 0.8
) -> dict[str, tuple[str, list[Word]]]:
    """Ground every extracted field: key -> (value, words). Several values of a key ground separately
    and their words are joined (the value shown is the values joined with ' | ')."""
    out: dict[str, tuple[str, list[Word]]] = {}
    for key, val in values.items():
        vals = [val] if isinstance(val, str) else [v for v in (val or []) if v]
        words: list[Word] = []
        for v in vals:
            words += [w for w in ground(v, doc, threshold) if w not in words]
        out[key] = (" | ".join(vals), words)
    return out


def _union(words: list[Word]) -> tuple[int, int, int, int]:
    return (
        min(w.box[0] for w in words),
        min(w.box[1] for w in words),
        max(w.box[2] for w in words),
        max(w.box[3] for w in words),
    )


def _free(rect: tuple[float, float, float, float], placed: list[tuple[float, float, float, float]]) -> bool:
    x0, y0, x1, y1 = rect
    return all(x1 <= p[0] or x0 >= p[2] or y1 <= p[1] or y0 >= p[3] for p in placed)


def _page_image(doc: Document, image: str | Path | Image.Image, page: int) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if Path(image).suffix.lower() == ".pdf":
        from pipkie.io.pdf import render_pdf_page

        size = doc.page_sizes[page] if page < len(doc.page_sizes) else None
        return render_pdf_page(image, page, size)
    with Image.open(image) as im:
        if getattr(im, "n_frames", 1) > 1:
            im.seek(page)
        return (ImageOps.exif_transpose(im) or im).convert("RGB")


def draw(
    doc: Document,
    results: dict[str, tuple[str, list[Word]]],
    image_path: str | Path | Image.Image,
    out_path: str | Path,
    page: int = 0,
) -> Path:
    """Draw each key's word boxes and a 'key: value' label on page `page` of the document's image
    (an image file, a frame of a TIFF, a PDF page, or a PIL image) and save it to `out_path`.

    Boxes are scaled from 0-1000 to the image's own size, so any resolution of the page works.
    """
    im = _page_image(doc, image_path, page)
    canvas = ImageDraw.Draw(im)
    sx, sy = im.width / 1000, im.height / 1000
    line_w = max(2, im.width // 400)
    try:
        font = ImageFont.load_default(size=max(11, min(im.width // 40, im.height // 80)))
    except TypeError:  # Pillow without FreeType: fixed-size bitmap font
        font = ImageFont.load_default()
    placed: list[tuple[float, float, float, float]] = []  # label rectangles drawn so far
    for n, (key, (value, words)) in enumerate(results.items()):
        color = PALETTE[n % len(PALETTE)]
        on_page = [w for w in words if w.page == page]
        for w in on_page:
            x0, y0, x1, y1 = w.box
            canvas.rectangle((x0 * sx, y0 * sy, x1 * sx, y1 * sy), outline=color, width=line_w)
        if not on_page:
            continue
        label = f"{key}: {value}"
        label = label if len(label) <= 60 else label[:57] + "..."
        ux0, uy0, _, uy1 = _union(on_page)
        l, t, r, b = canvas.textbbox((0, 0), label, font=font)
        tw, th = r - l + 6, b - t + 6
        x = min(max(0, ux0 * sx), max(0, im.width - tw))
        above, below = uy0 * sy - th - line_w, uy1 * sy + line_w
        # above the words if there is room and no other label, else below, else further out
        tries = [y for k in range(6) for y in (above - k * th, below + k * th) if 0 <= y <= im.height - th]
        y = next((y for y in tries if _free((x, y, x + tw, y + th), placed)), tries[0] if tries else 0)
        placed.append((x, y, x + tw, y + th))
        canvas.rectangle((x, y, x + tw, y + th), fill=color)
        canvas.text((x + 3 - l, y + 3 - t), label, fill="white", font=font)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    im.save(out)
    return out
