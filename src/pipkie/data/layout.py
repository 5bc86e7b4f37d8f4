"""Page layout: rows of text segments -> a Document with OCR-like words, 0-1000 boxes and a PNG.

The generators (`pipkie.data.synthetic`, `pipkie.data.receipts`) describe a page as rows of
`(text, position, align[, key])` segments, `position` 0-1 across the text area and `align` "l", "c"
or "r" (None = a small gap); `lay_out` measures them with a real font (DejaVu from
`fonts-dejavu-core` when installed, else Pillow's default), optionally rotates the page by a small
skew, adds OCR-like noise to the words (never to the ground truth or the image), and draws the page
when `render=True`; `render=False` skips all drawing and yields the very same words and boxes.

    docs = lay_out(build, 100, seed=0, kind="receipt", fonts=RECEIPT_FONTS, widths=RECEIPT_WIDTHS,
                   render=False)

`build(rng, fake, fit, rule, missing_prob, variety) -> (rows, fields)`: `fit(text, frac=1.0)` wraps
text to a share of the text area, `rule` is a line of dashes as wide as the page. Document i
depends only on (kind, seed, i), given the same Faker version and fonts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

from faker import Faker
from PIL import Image, ImageDraw, ImageFont

from pipkie.data.noise import ocr_noise
from pipkie.io.document import Document, Word, normalize_box

Row = list[tuple[str, float, str]]  # (text, position 0-1 across the text area, align "l" | "c" | "r")

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
RECEIPT_FONTS = ("DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansCondensed.ttf", "DejaVuSans.ttf")
FORM_FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansCondensed.ttf")
RECEIPT_WIDTHS, FORM_WIDTHS = (420, 480, 540, 600), (760, 850, 960)


@lru_cache(maxsize=64)
def load_font(name: str, size: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / name
    if path.is_file():
        return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size=size)


def wrap(text: str, font, max_width: float) -> list[str]:
    lines, current = [], ""
    for word in text.split():
        trial = f"{current} {word}".strip()
        if current and font.getlength(trial) > max_width:
            lines.append(current)
            current = word
        else:
            current = trial
    return lines + [current] if current else lines


def lay_out(
    build: Callable,
    n: int,
    seed: int,
    *,
    kind: str,
    fonts: tuple[str, ...],
    widths: tuple[int, ...],
    out_dir: str | Path | None = None,
    render: bool = True,
    layout_variety: bool = True,
    missing_prob: float = 0.05,
    noise: float = 0.0,
    skew: float = 0.0,
    id_prefix: str = "doc",
    start: int = 0,
    rules: float = 1.0,
) -> Iterator[Document]:
    """Documents start..n-1 of `build` (a generator; wrap in list()). Raises ValueError at once (not
    on the first draw) when `render=True` has no `out_dir` to write the PNG images to. `rules`: the
    share of documents printed with their dashed rule lines (else `rule` is "" and `build` draws
    none: WildReceipt's transcriptions have no such line, and a model that learnt "the items are
    between the rules" takes a receipt's header and TOTAL lines for items there); at 1.0 no draw
    changes."""
    if not 0.0 <= rules <= 1.0:
        raise ValueError(f"rules must be a share between 0 and 1 (got {rules})")
    if render and out_dir is None:
        raise ValueError("render=True needs out_dir (where the PNG images are written); or pass render=False")
    if render:
        Path(out_dir).mkdir(parents=True, exist_ok=True)

    def documents() -> Iterator[Document]:  # a generator: the checks above run at the call
        fake = Faker("en_MS")
        for i in range(start, n):
            rng = random.Random(f"pipkie-{kind}-{seed}-{i}")
            fake.seed_instance(rng.randrange(2**32))
            font_name = rng.choice(fonts) if layout_variety else fonts[0]
            size = rng.randint(15, 22) if layout_variety else 18
            width = rng.choice(widths) if layout_variety else widths[1]
            font, margin = load_font(font_name, size), rng.randint(12, 40) if layout_variety else 24
            text_w = width - 2 * margin
            fit = lambda t, frac=1.0: wrap(t, font, text_w * frac) or [t]  # noqa: E731
            rule = "-" * int(text_w * rng.uniform(0.6, 1.0) / font.getlength("-"))
            if rules < 1.0 and rng.random() >= rules:  # no draw at 1.0: documents as before
                rule = ""
            rows, fields = build(rng, fake, fit, rule, missing_prob, layout_variety)
            line_h = size * (rng.uniform(1.2, 1.6) if layout_variety else 1.4)
            segments, y = [], float(margin)
            for row in rows:
                if row is None:
                    y += line_h * 0.6
                    continue
                for text, pos, align, *_ in row:
                    w = font.getlength(text)
                    x = margin + pos * text_w - (0 if align == "l" else w if align == "r" else w / 2)
                    segments.append((text, max(2.0, x), y))
                y += line_h
            height = int(y + margin)
            angle = rng.uniform(-skew, skew) if skew else 0.0
            c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
            w2, h2 = math.ceil(abs(width * c) + abs(height * s)), math.ceil(abs(width * s) + abs(height * c))
            cx, cy, cx2, cy2 = width / 2, height / 2, w2 / 2, h2 / 2
            rotate = lambda x, y: (cx2 + (x - cx) * c + (y - cy) * s, cy2 - (x - cx) * s + (y - cy) * c)  # noqa: E731
            words = []
            for text, x, y in segments:
                l, t, r, b = font.getbbox(text)
                corners = [rotate(px, py) for px in (x + l, x + r) for py in (y + t, y + b)]
                shown = ocr_noise(text, rng, noise) if noise else text
                words.append(Word(shown, normalize_box([v for pt in corners for v in pt], w2, h2)))
            doc_id = f"{id_prefix}-{seed}-{i:06d}"
            images = []
            if render:
                bg, ink = rng.randint(225, 255), rng.randint(0, 60)
                im = Image.new("L", (width, height), bg)
                draw = ImageDraw.Draw(im)
                for text, x, y in segments:
                    draw.text((x, y), text, font=font, fill=ink)
                if angle:
                    inverse = (c, -s, cx - c * cx2 + s * cy2, s, c, cy - s * cx2 - c * cy2)
                    im = im.transform(
                        (w2, h2), Image.Transform.AFFINE, inverse, Image.Resampling.BILINEAR, fillcolor=bg
                    )
                path = Path(out_dir) / f"{doc_id}.png"
                im.save(path)
                images = [str(path)]
            yield Document(id=doc_id, words=words, page_sizes=[(w2, h2)], fields=fields, images=images)

    return documents()
