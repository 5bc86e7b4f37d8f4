"""Documents: OCR words with boxes, optional ground truth, and the one serialization used everywhere.

A `Document` is both what users extract from and what training/evaluation read: the readers in
`pipkie.data` yield Documents with `fields` filled in; OCR (`pipkie.io.ocr`) yields them with `fields`
empty. Boxes are normalised to 0-1000 on their page (as in LayoutLM), so serialization does not
depend on the image resolution.

`serialize(doc)` turns the words into text in reading order (`pipkie.io.reading_order`: words
grouped into lines, robust to tilted photos and tall OCR boxes; lines top to bottom, words left to
right). Training, evaluation and extraction all call this one function.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipkie.io.reading_order import reading_order_lines


@dataclass
class Word:
    """One OCR token or segment: its text and box (x0, y0, x1, y1), 0-1000 on its page, and the text
    line the OCR engine read it in (`line`, numbered per document; -1 when unknown: dataset words,
    generated pages). Words of one engine line stay together and in order in `serialize`."""

    text: str
    box: tuple[int, int, int, int] = (0, 0, 0, 0)
    page: int = 0
    line: int = -1

    @property
    def cy(self) -> float:
        return (self.box[1] + self.box[3]) / 2

    @property
    def height(self) -> int:
        return max(1, self.box[3] - self.box[1])


@dataclass
class Document:
    """A document (one or more pages of words), with ground-truth fields when it is labelled.

    fields: key -> list of values (several for multi-valued keys such as Kleister's `party`).
    page_sizes: (width, height) in pixels or points of each page, to map boxes back to the page.
    text: optional pre-serialized text (for text-only sources); used instead of the words if set.
    """

    id: str
    words: list[Word] = field(default_factory=list)
    page_sizes: list[tuple[int, int]] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    text: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for w in d["words"]:
            if w["line"] < 0:
                del w["line"]  # written only when the OCR engine gave it
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Document:
        words = [Word(w["text"], tuple(w["box"]), w.get("page", 0), w.get("line", -1)) for w in d.get("words", [])]
        return cls(
            id=str(d["id"]),
            words=words,
            page_sizes=[tuple(p) for p in d.get("page_sizes", [])],
            fields={k: list(v) for k, v in d.get("fields", {}).items()},
            images=list(d.get("images", [])),
            text=d.get("text"),
        )

    def value(self, key: str) -> str | None:
        """The field's values joined by ' | ' (how multi-valued keys are written in templates), or None."""
        values = self.fields.get(key) or []
        return " | ".join(values) if values else None

    def items(self, columns: dict[str, str]) -> list[dict[str, str | None]]:
        """Line items from parallel multi-valued fields (`items.name`, `items.price`, … as the readers
        write them): columns = {item field: document key}; item i takes value i of every column, ""
        or a short column → None (not printed). As many items as the longest column."""
        cols = {f: self.fields.get(k) or [] for f, k in columns.items()}
        n = max((len(v) for v in cols.values()), default=0)
        return [{f: (v[i] if i < len(v) else "") or None for f, v in cols.items()} for i in range(n)]


def normalize_box(points: Iterable[float], width: float, height: float) -> tuple[int, int, int, int]:
    """Axis-aligned 0-1000 box of a list of x, y coordinates (2 or 4 corners) on a width x height page."""
    pts = list(points)
    xs, ys = pts[0::2], pts[1::2]
    clamp = lambda v: max(0, min(1000, int(round(v))))  # noqa: E731
    return (
        clamp(min(xs) * 1000 / width),
        clamp(min(ys) * 1000 / height),
        clamp(max(xs) * 1000 / width),
        clamp(max(ys) * 1000 / height),
    )


def serialize(doc: Document, layout: bool = False) -> str:
    """The document as model input text: one line per visual line, in reading order.

    layout=True prefixes each line with a coarse position hint `<y,x>` (0-99 grid) of its first word,
    for models trained with layout hints.
    """
    if doc.text is not None:
        return doc.text
    out = []
    for line in reading_order_lines(doc.words):
        text = " ".join(w.text for w in line if w.text.strip())
        if not text:
            continue
        if layout:
            text = f"<{line[0].box[1] // 10},{line[0].box[0] // 10}> {text}"
        out.append(text)
    return "\n".join(out)


def save_jsonl(docs: Iterable[Document], path: str | Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def load_jsonl(path: str | Path) -> Iterator[Document]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Document.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: not a pipkie document ({e})") from e
