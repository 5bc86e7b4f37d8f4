"""Donut's dataset layout (`metadata.jsonl` next to the images): import and export.

    {data_dir}/{split}/metadata.jsonl    (or {data_dir}/metadata.jsonl)
    {"file_name": "receipt_00000.png", "ground_truth": "{\\"gt_parse\\": {...}, ...}"}

`ground_truth` is a JSON string (as Donut and the Hugging Face CORD/SROIE exports write it) or an
already-parsed object. Its `gt_parse` (or each item of `gt_parses`) is the nested target, e.g.
{"menu": [{"nm": "Latte", "price": "4.50"}, ...], "total": {"total_price": "4.50"}}; it is
flattened into fields by joining keys with '.' and keeping repeated values in order:
{"menu.nm": ["Latte", ...], "menu.price": ["4.50", ...], "total.total_price": ["4.50"]}.
Optional CORD-style extras are used when present: `valid_line` (OCR lines, each with `words` of
{"text", "quad": {x1..y4}, "is_key"}) gives the words, `meta.image_size` the page size.

Export (`write_donut`) writes the same layout: `gt_parse` is the fields un-flattened (one-valued keys
become strings, several values a list; the i-th values of `menu.*` make the i-th menu object, see
`unflatten`); every word becomes a one-word `valid_line` in pixels of the first page (`meta` keeps
its size); the image is copied next to `metadata.jsonl`, named after the document id ('/' and other
characters unsafe in file names become '_'). A re-import gives back id, fields and words;
`Document.text` (text-only sources) is not exported.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipkie.data.errors import DataError
from pipkie.io.document import Document, Word, normalize_box


def flatten(obj: Any, prefix: str = "", out: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Nested gt_parse -> {"a.b": [values in document order]}; empty strings and None are dropped."""
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, list):
        for item in obj:
            flatten(item, prefix, out)
    elif obj is not None:
        text = str(obj).strip()
        if text:
            out.setdefault(prefix or "text", []).append(text)
    return out


def unflatten(fields: dict[str, list[str]]) -> dict[str, Any]:
    """Inverse of `flatten` up to its ambiguity: flatten(unflatten(f)) == f.

    Keys sharing a prefix are grouped; the i-th values of the sub-keys make the i-th object of a list
    (CORD's menu items). Flat fields do not record which item a value came from, so items whose
    sub-keys were missing are re-aligned to the front (a lone `menu.sub.nm` goes to the first menu
    item). A key that is both a value and a prefix ("a" and "a.b") raises ValueError.
    """
    fields = {k: v for k, v in fields.items() if v}
    leaves = {k: v for k, v in fields.items() if "." not in k}
    groups: dict[str, dict[str, list[str]]] = {}
    for k, v in fields.items():
        if "." in k:
            head, rest = k.split(".", 1)
            groups.setdefault(head, {})[rest] = v
    out: dict[str, Any] = {}
    for k in fields:  # keep the first-seen key order
        head = k.split(".", 1)[0]
        if head in out:
            continue
        if head in leaves and head in groups:
            raise ValueError(f"key {head!r} is both a value and a prefix of {head}.{next(iter(groups[head]))}")
        if head in leaves:
            out[head] = leaves[head][0] if len(leaves[head]) == 1 else list(leaves[head])
            continue
        sub = groups[head]
        n = max(len(vals) for vals in sub.values())
        items = [unflatten({sk: [vals[i]] for sk, vals in sub.items() if i < len(vals)}) for i in range(n)]
        out[head] = items[0] if n == 1 else items
    return out


def words_from_valid_line(valid_line: list, width: float, height: float) -> list[Word]:
    """CORD `valid_line` -> Words (one per OCR word, quad corners in pixels)."""
    words = []
    for line in valid_line:
        for w in line["words"]:
            q = w["quad"]
            pts = [float(q[f"{axis}{i}"]) for i in range(1, 5) for axis in "xy"]
            text = str(w["text"]).strip()
            if text:
                words.append(Word(text, normalize_box(pts, width, height)))
    return words


def fields_from_valid_line(valid_line: list) -> dict[str, list[str]]:
    """Fields from CORD's line categories when there is no gt_parse: one value per line (key words skipped)."""
    fields: dict[str, list[str]] = {}
    for line in valid_line:
        text = " ".join(str(w["text"]).strip() for w in line["words"] if not w.get("is_key"))
        if text.strip() and line.get("category"):
            fields.setdefault(str(line["category"]), []).append(text.strip())
    return fields


def doc_from_ground_truth(doc_id: str, gt: Any, image: Path | None = None) -> Document:
    """A Document from a Donut/CORD ground-truth object; KeyError/TypeError/ValueError if malformed."""
    if isinstance(gt, str):
        gt = json.loads(gt)
    if not isinstance(gt, dict):
        raise TypeError("ground truth must be a JSON object")
    if "gt_parse" in gt or "gt_parses" in gt:
        parses = [gt["gt_parse"]] if "gt_parse" in gt else list(gt["gt_parses"])
        fields: dict[str, list[str]] = {}
        for parse in parses:
            flatten(parse, out=fields)
    else:
        fields = fields_from_valid_line(gt.get("valid_line", []))
    size = (gt.get("meta") or {}).get("image_size")
    width, height = (float(size["width"]), float(size["height"])) if size else (None, None)
    if width is None and image is not None:
        from PIL import Image

        with Image.open(image) as im:
            width, height = im.size
    valid_line = gt.get("valid_line") or []
    if width is None:
        quads = [w["quad"] for line in valid_line for w in line["words"]]
        width = max((float(q[f"x{i}"]) for q in quads for i in range(1, 5)), default=1) or 1
        height = max((float(q[f"y{i}"]) for q in quads for i in range(1, 5)), default=1) or 1
    words = words_from_valid_line(valid_line, width, height)
    return Document(
        id=doc_id,
        words=words,
        page_sizes=[(int(width), int(height))],
        fields=fields,
        images=[str(image)] if image is not None else [],
    )


def read_metadata_jsonl(path: Path, limit: int | None = None) -> Iterator[Document]:
    """Documents of one metadata.jsonl, in file order (ids: the image file's stem)."""
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and n >= limit:
                return
            try:
                rec = json.loads(line)
                file_name = str(rec["file_name"])
                image: Path | None = path.parent / file_name
                if not image.exists():
                    image = None
                doc = doc_from_ground_truth(Path(file_name).stem, rec["ground_truth"], image)
            except json.JSONDecodeError as e:
                raise DataError(path, f"not JSON ({e.msg})", line=i) from e
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DataError(path, f"bad Donut record ({type(e).__name__}: {e})", line=i) from e
            yield doc
            n += 1


def read_donut(data_dir: str | Path, split: str = "train", limit: int | None = None) -> Iterator[Document]:
    """Yield the documents of `{data_dir}/{split}/metadata.jsonl` (or `{data_dir}/metadata.jsonl`)."""
    root = Path(data_dir)
    for path in (root / split / "metadata.jsonl", root / "metadata.jsonl"):
        if path.is_file():
            yield from read_metadata_jsonl(path, limit)
            return
    raise DataError(root / split / "metadata.jsonl", "no such file (expected Donut's metadata.jsonl)")


def _safe_name(doc_id: str) -> str:
    return re.sub(r"[\\/:*?\"<>|\s]+", "_", doc_id) or "doc"


def write_donut(docs: Iterable[Document], out_dir: str | Path, copy_images: bool = True) -> int:
    """Write documents as `{out_dir}/metadata.jsonl` (+ images); returns how many were written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out / "metadata.jsonl", "w", encoding="utf-8") as f:
        for doc in docs:
            name = _safe_name(doc.id)
            src = Path(doc.images[0]) if doc.images else None
            file_name = f"{name}{src.suffix if src else '.png'}"
            if copy_images and src is not None and src.is_file():
                if src.resolve() != (out / file_name).resolve():
                    shutil.copyfile(src, out / file_name)
            width, height = doc.page_sizes[0] if doc.page_sizes else (1000, 1000)
            valid_line = [
                {
                    "words": [{"text": w.text, "is_key": 0, "quad": _quad(w.box, width, height)}],
                    "category": "",
                }
                for w in doc.words
            ]
            gt = {
                "gt_parse": unflatten(doc.fields),
                "meta": {"image_id": doc.id, "image_size": {"width": width, "height": height}},
                "valid_line": valid_line,
            }
            f.write(
                json.dumps(
                    {"file_name": file_name, "ground_truth": json.dumps(gt, ensure_ascii=False)}, ensure_ascii=False
                )
                + "\n"
            )
            n += 1
    return n


def _quad(box: tuple[int, int, int, int], width: float, height: float) -> dict[str, float]:
    x0, y0, x1, y1 = (round(v * s / 1000, 2) for v, s in zip(box, (width, height, width, height)))
    return {"x1": x0, "y1": y0, "x2": x1, "y2": y0, "x3": x1, "y3": y1, "x4": x0, "y4": y1}
