"""A folder of pipkie JSON-words files (what `pipkie ocr` writes): one Document per `*.json`.

    docs = read_dataset("words", "runs/ocr/wildreceipt_unlabeled", "all")

Files are read in sorted path order, recursively; `split` selects a sub-folder (`all` or `.` for the
whole folder). Unlabelled OCR output has no fields; files with `fields` keep them. A file that is
not a pipkie document raises DataError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document


def read_words(data_dir: str | Path, split: str = "all", limit: int | None = None) -> Iterator[Document]:
    root = Path(data_dir) if split in ("all", ".", "") else Path(data_dir) / split
    if not root.is_dir():
        raise DataError(root, "no such directory (expected a folder of JSON-words files from `pipkie ocr`)")
    for n, path in enumerate(sorted(root.rglob("*.json"))):
        if limit is not None and n >= limit:
            return
        try:
            yield Document.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DataError(path, f"not a pipkie JSON-words document ({type(e).__name__}: {e})") from e
