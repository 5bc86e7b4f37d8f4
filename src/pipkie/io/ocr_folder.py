"""OCR a folder of images/PDFs into pipkie's JSON-words files, resumably (`pipkie ocr`).

    n = ocr_folder("scans/", "scans-words/", engine="rapidocr", threads=1)

Every image or PDF under the input folder (recursively, in sorted order) becomes
`{out}/{relative path}.json`: `Document.to_dict()` plus `"normalized": true`, which
`pipkie.io.loaders.load_document` and the `words` dataset reader (`pipkie.data.words`) read back.
A file whose output already exists is skipped, so a killed run resumes where it stopped; each
output is written to a temporary name and renamed, so a kill never leaves half a file. A file that
cannot be read is recorded in `{out}/errors.jsonl` (path and reason) and the run goes on.
`shard=(i, n)` processes every n-th file starting at i: n processes with one thread each keep n
cores busy without the thread oversubscription that slows ONNX Runtime on a shared machine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pipkie.io.loaders import DocumentError, load_document

EXTENSIONS = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif", ".pdf"}


def write_json_atomic(path: Path, record: dict) -> None:
    """Write `record` as JSON to a temporary name and rename it: a kill never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    tmp.rename(path)


def list_inputs(src: str | Path) -> list[Path]:
    """Images and PDFs under `src` (a folder, searched recursively, or one file), sorted."""
    root = Path(src)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS)


def _relative(path: Path, src: Path) -> Path:
    return path.relative_to(src) if src.is_dir() else Path(path.name)


def output_path(path: Path, src: Path, out: Path) -> Path:
    rel = _relative(path, src)
    return out / rel.with_name(rel.name + ".json")


def doc_id(path: Path, src: Path) -> str:
    """The file's path under `src` without its extension, `/` -> `_` (WildReceipt's ids too)."""
    return str(_relative(path, src).with_suffix("")).replace(os.sep, "_")


def ocr_folder(
    src: str | Path,
    out: str | Path,
    *,
    engine: str = "rapidocr",
    threads: int = 1,
    limit: int | None = None,
    shard: tuple[int, int] = (0, 1),
    max_pages: int = 20,
    progress: bool = True,
) -> dict:
    """OCR every input not yet done; returns counts {done, skipped, failed, seconds}."""
    src, out = Path(src), Path(out)
    index, count = shard
    if not (count >= 1 and 0 <= index < count):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    files = list_inputs(src)[index::count][:limit]
    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in files if not output_path(p, src, out).exists()]
    stats = dict(done=0, skipped=len(files) - len(todo), failed=0, seconds=0.0)
    from tqdm import tqdm

    t0 = time.time()
    bar = tqdm(
        todo,
        unit="file",
        file=sys.stderr,
        disable=not progress,
        mininterval=10,
        desc=f"ocr {index + 1}/{count}" if count > 1 else "ocr",
    )
    for path in bar:
        target = output_path(path, src, out)
        try:
            doc = load_document(path, ocr=engine, threads=threads, max_pages=max_pages)
        except DocumentError as e:
            stats["failed"] += 1
            with open(out / "errors.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"path": str(path), "error": str(e)}) + "\n")
            continue
        record = doc.to_dict()
        record.update(id=doc_id(path, src), normalized=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target, record)
        stats["done"] += 1
    stats["seconds"] = round(time.time() - t0, 1)
    return stats
