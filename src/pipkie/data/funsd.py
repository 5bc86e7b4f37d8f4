"""FUNSD (noisy scanned forms) in its official release layout.

    {data_dir}/training_data/annotations/{id}.json   (split "train")
    {data_dir}/testing_data/annotations/{id}.json    (split "test")
    .../images/{id}.png                               optional, used for the page size

(`{data_dir}/{split}/annotations/` is accepted too.) Each JSON file is one form:

    {"form": [{"id": 0, "text": "DATE:", "box": [x0, y0, x1, y1], "label": "question",
               "words": [{"text": "DATE:", "box": [x0, y0, x1, y1]}], "linking": [[0, 1]]}, ...]}

Labels are question / answer / header / other; `linking` pairs are [from_id, to_id] and usually
appear on both linked entities. Words: the entities' word boxes (pixels, normalised to 0-1000).
Page size: the image's size when the image is present, else the extent of all boxes.

Fields: key = a question's text (whitespace collapsed, a trailing ':' removed), value = the text of
each answer linked to it, in reading order; a question asked twice gathers the values of both;
questions with no (non-empty) linked answer are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document, Word, normalize_box

SPLIT_DIRS = {"train": "training_data", "test": "testing_data"}


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def question_key(text: str) -> str:
    """How a question's text becomes a field key: whitespace collapsed, trailing ':' dropped."""
    return _clean(text).rstrip(":").strip()


def _page_size(image: Path | None, boxes: list[list[float]]) -> tuple[int, int]:
    if image is not None:
        from PIL import Image

        with Image.open(image) as im:
            return im.size
    width = max((b[2] for b in boxes), default=1) or 1
    height = max((b[3] for b in boxes), default=1) or 1
    return int(width), int(height)


def parse_form(path: Path, image: Path | None = None) -> Document:
    """One FUNSD annotation file as a Document (raises DataError if it is not a FUNSD form)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(path, f"cannot read ({e})") from e
    try:
        form = json.loads(raw)["form"]
    except json.JSONDecodeError as e:
        raise DataError(path, f"not JSON ({e.msg})", line=e.lineno) from e
    except (KeyError, TypeError):
        raise DataError(path, "no top-level `form` list (not a FUNSD annotation)") from None
    try:
        entities = {int(e["id"]): e for e in form}
        word_rows = [([float(v) for v in w["box"]], str(w["text"]).strip()) for e in form for w in e.get("words", [])]
        boxes = [b for b, _ in word_rows] + [[float(v) for v in e["box"]] for e in form]
        if any(len(b) != 4 for b in boxes):
            raise ValueError("boxes must be [x0, y0, x1, y1]")
        links = {(int(a), int(b)) for e in form for a, b in e.get("linking", [])}
        labels = {i: str(e["label"]).lower() for i, e in entities.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(path, f"bad entity ({type(e).__name__}: {e})") from e
    width, height = _page_size(image, boxes)
    words = [Word(t, normalize_box(b, width, height)) for b, t in word_rows if t]
    answers: dict[int, list[int]] = {}
    for a, b in sorted(links):
        if a not in entities or b not in entities:
            raise DataError(path, f"linking [{a}, {b}] names an entity that does not exist")
        if labels[a] == "answer" and labels[b] == "question":
            a, b = b, a
        if labels[a] == "question" and labels[b] == "answer" and b not in answers.setdefault(a, []):
            answers[a].append(b)
    fields: dict[str, list[str]] = {}
    for q in sorted(answers, key=lambda i: (entities[i]["box"][1], entities[i]["box"][0])):
        key = question_key(str(entities[q]["text"]))
        ordered = sorted(answers[q], key=lambda i: (entities[i]["box"][1], entities[i]["box"][0]))
        values = [v for v in (_clean(str(entities[i]["text"])) for i in ordered) if v]
        if key and values:
            fields.setdefault(key, []).extend(values)
    return Document(
        id=path.stem,
        words=words,
        page_sizes=[(width, height)],
        fields=fields,
        images=[str(image)] if image is not None else [],
    )


def read_funsd(data_dir: str | Path, split: str = "train", limit: int | None = None) -> Iterator[Document]:
    """Yield the split's forms, sorted by id."""
    root = Path(data_dir)
    candidates = [root / SPLIT_DIRS.get(split, split), root / split]
    split_dir = next((c for c in candidates if (c / "annotations").is_dir()), None)
    if split_dir is None:
        raise DataError(candidates[0] / "annotations", "no such directory (expected FUNSD's layout)")
    for n, path in enumerate(sorted((split_dir / "annotations").glob("*.json"))):
        if limit is not None and n >= limit:
            return
        image = split_dir / "images" / f"{path.stem}.png"
        yield parse_form(path, image if image.exists() else None)
