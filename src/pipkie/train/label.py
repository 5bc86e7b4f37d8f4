"""`pipkie label`: pseudo-labels for unlabelled documents, the model's confident answers (self-training).

    stats = label_folder(extractor, "runs/ocr/scans", "runs/pseudo/scans",
                         keys="company,date:date,total:money", min_confidence=0.9)

Real documents of a user's kind are plentiful and unlabelled; the model already reads many of their
values right, and its calibrated confidence says which (`pipkie calibrate`: on WildReceipt dev, the
shipped model's values at >= 0.9 are exact 92% of the time). Every value the model answers with a
confidence at or above `min_confidence` becomes a field of the document; everything else is left
out, so a training template built from the output (`pipkie.train.mixture`, dataset `words`) asks
only for values the model was sure of, never for a key it was unsure of as if it were absent.
Self-training in this sense (Yarowsky 1995; Xie et al. 2020, "noisy student") teaches the model the
real documents' layouts through the values it already finds on them.

Input: a folder of JSON-words documents (`pipkie ocr`). Output: the same documents with `fields`
(only those with at least one confident value), `{out}/docs/{id}.json`, read back by
`read_dataset("words", out, "docs")` (a mixture entry's `"split": "docs"`); `{out}/labels.jsonl`
records, per document and key group, every value and confidence (kept or not), so that a killed run
resumes where it stopped and a second call with other keys adds their fields to the same documents.
`{out}/label.json` says which model, keys and threshold made it.
Lists (`items[...]`) are refused: an item list's confidence is per value, and one unsure price
would make the whole list a wrong target.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipkie.data.words import read_words
from pipkie.io.document import Document
from pipkie.io.ocr_folder import write_json_atomic
from pipkie.schema import KeySchema, SchemaError

MANIFEST = "labels.jsonl"
DOCS = "docs"  # the labelled documents' sub-folder (the summary beside it is no document)
SUMMARY = "label.json"


def _key_group(schema: KeySchema) -> str:
    return ",".join(k.name for k in schema.keys)


def done_groups(out: Path) -> dict[str, set[str]]:
    """Document id -> the key groups already labelled (from `labels.jsonl`; a torn last line is ignored)."""
    done: dict[str, set[str]] = {}
    path = out / MANIFEST
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write: that document is labelled again
        done.setdefault(row["id"], set()).add(row["keys"])
    return done


def _torn(path: Path) -> bool:
    """The file's last line has no newline (a run killed while writing it)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _write_doc(path: Path, doc: Document, fields: dict[str, str]) -> None:
    """Add `fields` to the document stored at `path` (or to `doc`), atomically (temporary name, rename)."""
    if path.exists():
        record = json.loads(path.read_text(encoding="utf-8"))
    else:
        record = {**doc.to_dict(), "normalized": True, "fields": {}}
    record["fields"].update({k: [v] for k, v in fields.items()})
    write_json_atomic(path, record)


def _file_name(doc_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in doc_id) + ".json"


def label_folder(
    extractor,
    src: str | Path,
    out: str | Path,
    *,
    keys: str | KeySchema,
    min_confidence: float = 0.9,
    store_as: dict[str, str] | None = None,
    batch_size: int = 4,
    limit: int | None = None,
    progress: bool = True,
) -> dict:
    """Label every document of `src` not yet labelled with these keys; returns counts per key.

    `store_as` renames fields on the way out (`{"company": "store_name"}`: ask the model the key it
    reads best, store it under the training data's canonical name, `pipkie.train.keys.ALIASES`)."""
    if not 0.0 < min_confidence <= 1.0:
        raise ValueError(f"min_confidence must be in (0, 1], got {min_confidence}")
    schema = keys if isinstance(keys, KeySchema) else KeySchema.resolve(keys)
    if schema.groups:
        raise SchemaError("pseudo-labels take flat keys only (a list's items are not labelled one value at a time)")
    store_as = store_as or {}
    unknown = set(store_as) - {k.name for k in schema.keys}
    if unknown:
        raise ValueError(f"store_as names keys that are not asked: {', '.join(sorted(unknown))}")
    src, out = Path(src), Path(out)
    (out / DOCS).mkdir(parents=True, exist_ok=True)
    group = _key_group(schema)
    done = done_groups(out)
    docs = [d for d in read_words(src, "all", limit=limit) if group not in done.get(d.id, set())]
    kept = {store_as.get(k.name, k.name): 0 for k in schema.keys}
    stats = {"documents": len(docs), "labelled": 0, "values": 0, "kept": kept}
    from tqdm import tqdm

    bar = tqdm(total=len(docs), unit="doc", file=sys.stderr, disable=not progress, mininterval=10, desc="label")
    with open(out / MANIFEST, "a", encoding="utf-8") as manifest:
        if _torn(out / MANIFEST):
            manifest.write("\n")  # end the line a kill tore, so that the next row starts on its own line
        for i in range(0, len(docs), batch_size):
            chunk = docs[i : i + batch_size]
            results = extractor.extract_many(chunk, schema=schema, batch_size=batch_size)
            for doc, res in zip(chunk, results):
                answers, fields = {}, {}
                for name, f in res.fields.items():
                    stored = store_as.get(name, name)
                    answers[stored] = [f.value, f.confidence]
                    if f.value is not None:
                        stats["values"] += 1
                        if f.confidence >= min_confidence and not f.truncated:
                            fields[stored] = f.value
                            kept[stored] += 1
                if fields:
                    _write_doc(out / DOCS / _file_name(doc.id), doc, fields)
                    stats["labelled"] += 1
                manifest.write(json.dumps({"id": doc.id, "keys": group, "answers": answers}, ensure_ascii=False) + "\n")
                manifest.flush()
            bar.update(len(chunk))
    bar.close()
    summary_path = out / SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"runs": []}
    summary["runs"].append(
        {"model": str(extractor.name), "keys": group, "min_confidence": min_confidence, "store_as": store_as, **stats}
    )
    summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    return stats
