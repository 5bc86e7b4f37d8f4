"""What an evaluation reads: the split's documents (with the dataset's words, or re-OCR'd from their
images), and the gold value of each requested key (through a key map).

- Key map: `"company=store_name,address=store_addr"` → the model is asked for `company` and its
  answer is scored against the dataset's `store_name` (datasets name their classes their own way:
  WildReceipt's reader calls the store name `store_name`). Unmapped keys are read as named.
- OCR (`ocr="rapidocr"` or `"tesseract"`): each document's images (`Document.images`) are OCR'd by
  `pipkie.io.ocr_folder.ocr_folder`, which writes one JSON-words file per image, and the words of
  those files replace the dataset's (gold values stay the dataset's). The cache mirrors the image
  paths under the data directory, `{cache}/{path relative to data_dir}.json`, the layout `pipkie ocr
  DATA_DIR --out CACHE` writes (or `pipkie ocr DATA_DIR/SUBFOLDER`: paths relative to a folder
  inside the data directory are found too), so a folder OCR'd that way is reused as it is, and a
  re-run OCRs nothing. An image the engine cannot read leaves its document without words (a
  warning says which).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipkie.data import read_dataset
from pipkie.io.document import Document, Word
from pipkie.io.ocr import LINES_PER_PAGE
from pipkie.io.ocr_folder import ocr_folder, output_path


def parse_key_map(spec: str | dict | None, option: str = "--key-map", form: str = "KEY=GOLD_KEY") -> dict[str, str]:
    """`"a=x,b=y"` (or a dict) → {key: other name}; a malformed map raises ValueError naming `option`."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        return {str(k): str(v) for k, v in spec.items()}
    out: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, gold = (s.strip() for s in item.partition("="))
        if not sep or not key or not gold:
            raise ValueError(f"{option}: {item.strip()!r} is not {form} (e.g. company=store_name)")
        if key in out:
            raise ValueError(f"{option}: {key!r} is mapped twice")
        out[key] = gold
    return out


def gold_fields(doc: Document, keys: list[str], key_map: dict[str, str]) -> dict[str, list[str] | None]:
    return {k: doc.fields.get(key_map.get(k, k)) for k in keys}


def gold_column(group: str, name: str, key_map: dict[str, str]) -> str:
    """The document field holding a list's column: `items.name` for items[name]; the key map may
    rename the list (`lines=items`) or one column (`lines.product=items.name`)."""
    return key_map.get(f"{group}.{name}") or f"{key_map.get(group, group)}.{name}"


def gold_items(doc: Document, group, key_map: dict[str, str]) -> list[dict[str, str | None]]:
    """The gold items of a list (`pipkie.schema.Group`) from the document's parallel item fields
    (`items.name`, `items.price`, … as `pipkie.data` readers write them; "" = not printed)."""
    return doc.items({f: gold_column(group.name, f, key_map) for f in group.names})


def gold_warnings(
    docs: list[Document], keys: list[str], key_map: dict[str, str], groups: dict | None = None
) -> list[str]:
    """One message per requested key (or list: `groups`, name -> Group) that no document has a gold
    value for, and per map entry naming a key that was not requested."""
    groups = groups or {}
    present = {k for d in docs for k, v in d.fields.items() if v}
    out = []
    for k in keys:
        src = key_map.get(k, k)
        if src not in present:
            named = f"{k!r} (read from {src!r})" if src != k else repr(k)
            out.append(
                f"no document has a gold value for {named}: it scores 0 wherever the model answers it; "
                f"gold keys in this split: {', '.join(sorted(present)) or 'none'}"
                + ("" if src != k else f" (map one with --key-map {k}=GOLD_KEY)")
            )
    out += [
        f"--key-map names {k!r}, which is not among the keys evaluated"
        for k in key_map
        if k not in keys and k not in groups and k.split(".")[0] not in groups
    ]
    for g in (groups or {}).values():
        cols = [gold_column(g.name, f, key_map) for f in g.names]
        if not any(c in present for c in cols):
            out.append(
                f"no document has gold items for the list {g.name!r} (looked for {', '.join(cols)}): every "
                f"item it predicts counts as wrong"
            )
    return out


def _cached_words(image: Path, data_dir: Path, cache: Path, engine: str, threads: int) -> dict | None:
    """The JSON-words record of one image, OCR'd into the cache first if it is not there. The cache
    may mirror the data directory or any folder inside it (`pipkie ocr DATA_DIR/image_files`)."""
    image, data_dir = image.resolve(), data_dir.resolve()
    root = data_dir if image.is_relative_to(data_dir) else image.parent
    roots = [root, *[p for p in image.parents if p.is_relative_to(root) and p != root][::-1]]
    found = [t for t in (output_path(image, r, cache) for r in roots) if t.exists()]
    target = found[0] if found else output_path(image, root, cache)
    if not target.exists():
        ocr_folder(image, target.parent, engine=engine, threads=threads, progress=False)
    if not target.exists():  # the engine could not read it (ocr_folder logged why in errors.jsonl)
        return None
    return json.loads(target.read_text(encoding="utf-8"))


def ocr_document(doc: Document, data_dir: Path, cache: Path, engine: str, threads: int = 1) -> tuple[Document, bool]:
    """`doc` with its words replaced by its images' OCR (pages in image order); and whether every
    image was read."""
    words: list[Word] = []
    sizes: list[tuple[int, int]] = []
    ok = True
    for image in doc.images:
        rec = _cached_words(Path(image), data_dir, cache, engine, threads)
        if rec is None:
            ok = False
            continue
        page = Document.from_dict({**rec, "id": doc.id})
        offset = len(sizes)
        lines = offset * LINES_PER_PAGE  # the image's engine lines numbered as `to_words` numbers a page's
        words += [Word(w.text, w.box, w.page + offset, w.line if w.line < 0 else w.line + lines) for w in page.words]
        sizes += page.page_sizes or [(1000, 1000)]
    return Document(id=doc.id, words=words, page_sizes=sizes, fields=doc.fields, images=doc.images), ok


def load_documents(
    dataset: str,
    data_dir: str | Path,
    split: str,
    *,
    limit: int | None = None,
    ocr: str | None = None,
    ocr_cache: str | Path | None = None,
    threads: int = 1,
    log=print,
) -> tuple[list[Document], list[str]]:
    """(documents, warnings). With `ocr`, the words come from OCR of the images (cached in `ocr_cache`)."""
    docs = list(read_dataset(dataset, data_dir, split, limit=limit))
    if not docs:
        raise ValueError(f"{dataset} {split} under {data_dir}: no documents")
    if not ocr:
        return docs, []
    without = [d.id for d in docs if not d.images]
    if without:
        raise ValueError(
            f"--ocr {ocr}: {len(without)} of {len(docs)} documents of {dataset} {split} have no image "
            f"to OCR (first: {without[0]}); evaluate them with the dataset's words (no --ocr)"
        )
    cache = Path(ocr_cache)
    log(f"evaluate: OCR words from {cache} ({ocr}; images not cached yet are OCR'd now)")
    from tqdm.auto import tqdm

    out, failed = [], []
    for d in tqdm(docs, desc=f"ocr {ocr}", mininterval=5):
        doc, ok = ocr_document(d, Path(data_dir), cache, ocr, threads)
        out.append(doc)
        if not ok:
            failed.append(d.id)
    warnings = (
        [
            f"OCR could not read the image(s) of {len(failed)} document(s) ({', '.join(failed[:5])}"
            f"{', …' if len(failed) > 5 else ''}): scored without words; see {cache}/…/errors.jsonl"
        ]
        if failed
        else []
    )
    return out, warnings
