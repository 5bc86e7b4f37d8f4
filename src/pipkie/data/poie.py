"""POIE (Product-Oriented Information Extraction: nutrition-facts labels; Kuang et al., "Visual
Information Extraction in the Wild", ICDAR 2023), in the layout of its release (jfkuang/CFAM,
loaded there by `VIEE2EDataset` with `CustomLineJsonParser`).

    {data_dir}/train.txt, test.txt   one JSON object per line (one image):
        {"file_name": "images/0001.jpg", "height": 1280, "width": 960,
         "annotations": [{"polygon": [x1, y1, x2, y2, ...], "text": "Energy 2000kJ",
                          "entity": ["O", "O", ..., "B-ENERGY/100G", "I-ENERGY/100G", ...]}, ...],
         "entity_dict": {"ENERGY/100G": "2000kJ", ...}}
    {data_dir}/class_list.json       JSON list of the entity types (optional here; when present,
                                     tags and entity_dict keys must use its names)
    {data_dir}/dict.json             the OCR character set (not used)

This is the format as we understand it from the released loader and evaluator: `polygon` has 4 or
more points (an 8-number `box` is accepted too), `entity` holds one IOB tag per character of
`text`, texts `###` mark unreadable regions (skipped), and `entity_dict` (the evaluator's ground
truth) maps an entity type to its value. Fields: `entity_dict` when present (a list value gives
several values); otherwise rebuilt from the character tags: each B-/I- span is a value, spans of one
type are joined by spaces in reading order (duplicates kept once). Keys are the entity type names
as written (e.g. `ENERGY/100G`). Ids: the image path without extension, '/' -> '_'.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document, Word, normalize_box
from pipkie.io.reading_order import AS_SCORED, reading_order_lines


def read_class_list(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    try:
        classes = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(path, f"not JSON ({e.msg})", line=e.lineno) from e
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise DataError(path, "expected a JSON list of entity type names")
    return classes


def spans(text: str, tags: list[str]) -> list[tuple[str, str]]:
    """(entity type, text) of each B-/I- run in one text instance."""
    if len(tags) != len(text):
        raise ValueError(f"{len(tags)} entity tags for {len(text)} characters of {text!r}")
    out: list[tuple[str, str]] = []
    current: str | None = None
    for ch, tag in zip(text, tags):
        kind, _, name = tag.partition("-")
        if kind in ("B", "I") and name:
            if kind == "B" or name != current:
                out.append((name, ""))
                current = name
            out[-1] = (name, out[-1][1] + ch)
        elif tag == "O":
            current = None
        else:
            raise ValueError(f"bad IOB tag {tag!r}")
    return [(name, value.strip()) for name, value in out if value.strip()]


def _parse_record(rec: dict, classes: list[str] | None) -> tuple:
    width, height = float(rec["width"]), float(rec["height"])
    if width <= 0 or height <= 0:
        raise ValueError(f"bad page size {width}x{height}")
    words: list[Word] = []
    tagged: list[tuple[Word, list[tuple[str, str]]]] = []
    for ann in rec["annotations"]:
        text = str(ann["text"])
        if text == "###":
            continue
        points = [float(v) for v in (ann["polygon"] if "polygon" in ann else ann["box"])]
        if len(points) < 4 or len(points) % 2:
            raise ValueError(f"polygon must have an even number (>= 4) of coordinates, got {len(points)}")
        word = Word(text.strip(), normalize_box(points, width, height))
        if word.text:
            words.append(word)
        if ann.get("entity"):
            tagged.append((word, spans(text, list(ann["entity"]))))
    fields: dict[str, list[str]] = {}
    if rec.get("entity_dict"):
        for key, value in rec["entity_dict"].items():
            values = [str(v).strip() for v in (value if isinstance(value, list) else [value])]
            if any(values):
                fields[str(key)] = [v for v in values if v]
    else:
        by_word = {id(w): s for w, s in tagged}
        collected: dict[str, list[str]] = {}
        for line in reading_order_lines([w for w, _ in tagged], **AS_SCORED):
            for w in line:
                for name, value in by_word[id(w)]:
                    collected.setdefault(name, []).append(value)
        fields = {k: [" ".join(dict.fromkeys(v))] for k, v in collected.items()}
    if classes is not None:
        unknown = sorted(set(fields) - set(classes))
        if unknown:
            raise ValueError(f"entity types {unknown} are not in class_list.json")
    return words, (int(width), int(height)), fields


def read_poie(data_dir: str | Path, split: str = "train", limit: int | None = None) -> Iterator[Document]:
    """Yield the split's labels in file order."""
    root = Path(data_dir)
    ann_path = root / f"{split}.txt"
    if not ann_path.is_file():
        raise DataError(ann_path, "no such file (expected POIE's {split}.txt)")
    classes = read_class_list(root / "class_list.json")
    n = 0
    with open(ann_path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and n >= limit:
                return
            try:
                rec = json.loads(line)
                words, size, fields = _parse_record(rec, classes)
                file_name = str(rec["file_name"])
            except json.JSONDecodeError as e:
                raise DataError(ann_path, f"not JSON ({e.msg})", line=i) from e
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DataError(ann_path, f"bad POIE record ({type(e).__name__}: {e})", line=i) from e
            image = root / file_name
            yield Document(
                id=file_name.rsplit(".", 1)[0].replace("/", "_").replace("\\", "_"),
                words=words,
                page_sizes=[size],
                fields=fields,
                images=[str(image)] if image.exists() else [],
            )
            n += 1
