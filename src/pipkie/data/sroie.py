"""ICDAR 2019 SROIE task 3: `{split}/box/{id}.txt` OCR lines + `{split}/entities/{id}.txt` JSON.

Splits: the published `train` (626) and `test` (347), and two carved from train for model
selection: `dev` (the receipts whose id hashes into DEV_FRACTION of the space, ~60) and
`train_nodev` (train without them). Choices are made on `dev`; `test` is scored once per shipped model.

Box lines are `x1,y1,x2,y2,x3,y3,x4,y4,text` (the text may contain commas). Page sizes come from
`{split}/images.jsonl` when present, else from the image in `{split}/img/`, else from the boxes'
extent. Keys: company, date, address, total.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document, Word, normalize_box

KEYS = ("company", "date", "address", "total")
DEV_FRACTION = 0.1
CARVED = {"dev": True, "train_nodev": False}  # carved split -> holds the dev receipts


def in_dev(doc_id: str) -> bool:
    """Whether a train receipt belongs to the carved dev split (a stable hash of its id)."""
    import hashlib

    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:8], 16) < DEV_FRACTION * 16**8


def read_box_file(
    path: Path, width: float | None = None, height: float | None = None
) -> tuple[list[Word], tuple[int, int]]:
    """Words of one SROIE box file, normalised to 0-1000 (page size from the boxes if not given)."""
    rows: list[tuple[list[float], str]] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise DataError(path, f"cannot read box file ({e})") from e
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split(",", 8)
        if len(parts) < 9:
            raise DataError(path, "expected 8 coordinates and a text", line=i)
        try:
            coords = [float(p) for p in parts[:8]]
        except ValueError:
            raise DataError(path, "coordinates are not numbers", line=i) from None
        rows.append((coords, parts[8].strip()))
    if width is None or height is None:
        width = max((max(c[0::2]) for c, _ in rows), default=1) or 1
        height = max((max(c[1::2]) for c, _ in rows), default=1) or 1
    words = [Word(text, normalize_box(c, width, height)) for c, text in rows if text]
    return words, (int(width), int(height))


def read_sroie(data_dir: str | Path, split: str = "train", limit: int | None = None) -> Iterator[Document]:
    """Yield the split's receipts (sorted by id) with their ground-truth fields."""
    if split in CARVED:
        docs = (d for d in read_sroie(data_dir, "train") if in_dev(d.id) == CARVED[split])
        yield from (d for n, d in enumerate(docs) if limit is None or n < limit)
        return
    root = Path(data_dir) / split
    box_dir, ent_dir = root / "box", root / "entities"
    if not box_dir.is_dir():
        raise DataError(box_dir, "no such directory (expected SROIE's {split}/box/ layout)")
    sizes: dict[str, tuple[int, int]] = {}
    meta = root / "images.jsonl"
    if meta.exists():
        for i, line in enumerate(meta.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    m = json.loads(line)
                    sizes[m["id"]] = (int(m["width"]), int(m["height"]))
                except (json.JSONDecodeError, KeyError, ValueError) as e:
                    raise DataError(meta, f"bad image record ({e})", line=i) from e
    for n, box_path in enumerate(sorted(box_dir.glob("*.txt"))):
        if limit is not None and n >= limit:
            return
        doc_id = box_path.stem
        image = root / "img" / f"{doc_id}.jpg"
        size = sizes.get(doc_id)
        if size is None and image.exists():
            from PIL import Image

            with Image.open(image) as im:
                size = im.size
        words, page = read_box_file(box_path, *(size or (None, None)))
        fields: dict[str, list[str]] = {}
        ent_path = ent_dir / f"{doc_id}.txt"
        if ent_path.exists():
            try:
                ents = json.loads(ent_path.read_text(encoding="utf-8", errors="replace"))
            except json.JSONDecodeError as e:
                raise DataError(ent_path, f"entities are not JSON ({e.msg})", line=e.lineno) from e
            if not isinstance(ents, dict):
                raise DataError(ent_path, "entities must be a JSON object")
            fields = {k: [str(v).strip()] for k, v in ents.items() if str(v).strip()}
        yield Document(
            id=doc_id,
            words=words,
            page_sizes=[page],
            fields=fields,
            images=[str(image)] if image.exists() else [],
        )
