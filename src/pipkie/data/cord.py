"""CORD (Indonesian receipts, Clova AI), in either of the layouts it is distributed in.

1. The GitHub/Google-Drive release, one JSON per receipt:

       {data_dir}/{split}/json/receipt_00000.json    {split}/image/receipt_00000.png

   {"valid_line": [{"category": "menu.nm", "group_id": 3, "words": [{"text": "Latte", "is_key": 0,
     "quad": {"x1": .., "y1": .., "x2": .., "y2": .., "x3": .., "y3": .., "x4": .., "y4": ..}}]}],
    "meta": {"image_size": {"width": 864, "height": 1296}, ...}, "roi": .., "dontcare": [..]}

   A file may also carry Donut's `gt_parse` (as CORD-v2's ground truth does).
2. Donut / Hugging Face exports (naver-clova-ix/cord-v2 saved to disk): `{split}/metadata.jsonl`
   with `{"file_name", "ground_truth": "<JSON string with gt_parse, meta, valid_line>"}`.

Splits are train / dev / test (`validation` and `dev` are accepted for each other).
Fields: `gt_parse` flattened with '.' (`menu.nm`, `menu.price`, `menu.sub.nm`, `sub_total.tax_price`,
`total.total_price`, ...), repeated values (one per menu item) kept in order. Without a gt_parse
they come from `valid_line`: one value per line of each category, its non-key words joined by
spaces. Words: every `valid_line` word (quad in pixels -> 0-1000 box); page size from
`meta.image_size`, else the image, else the words' extent. Ids: the file stem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.donut import doc_from_ground_truth, read_metadata_jsonl
from pipkie.data.errors import DataError
from pipkie.io.document import Document

SPLIT_ALIASES = {"dev": "validation", "validation": "dev", "val": "dev"}


def read_cord_json(path: Path, image: Path | None = None) -> Document:
    """One CORD receipt JSON file (raises DataError naming the file if malformed)."""
    try:
        gt = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(path, f"cannot read ({e})") from e
    except json.JSONDecodeError as e:
        raise DataError(path, f"not JSON ({e.msg})", line=e.lineno) from e
    if isinstance(gt, dict) and isinstance(gt.get("ground_truth"), (str, dict)):
        gt = gt["ground_truth"]  # a single Donut record saved as a file
    try:
        return doc_from_ground_truth(path.stem, gt, image)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(path, f"bad CORD annotation ({type(e).__name__}: {e})") from e


def read_cord(data_dir: str | Path, split: str = "train", limit: int | None = None) -> Iterator[Document]:
    """Yield the split's receipts (sorted by file name for the JSON layout, file order for metadata.jsonl)."""
    root = Path(data_dir)
    for name in (split, SPLIT_ALIASES.get(split)):
        if name is None:
            continue
        split_dir = root / name
        if (split_dir / "json").is_dir():
            img_dir = split_dir / "image"
            for n, path in enumerate(sorted((split_dir / "json").glob("*.json"))):
                if limit is not None and n >= limit:
                    return
                images = sorted(img_dir.glob(f"{path.stem}.*")) if img_dir.is_dir() else []
                yield read_cord_json(path, images[0] if images else None)
            return
        if (split_dir / "metadata.jsonl").is_file():
            yield from read_metadata_jsonl(split_dir / "metadata.jsonl", limit)
            return
    raise DataError(root / split, "no CORD data (expected {split}/json/*.json or {split}/metadata.jsonl)")
