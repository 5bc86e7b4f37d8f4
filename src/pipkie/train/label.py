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
Lists (`items[name,price:money]`) are checked by arithmetic instead of confidence (`sum_to`): an
item list's confidence is per value, and one unsure price, or a header or TOTAL line taken for an
item, would make the whole list a wrong target. The list is kept only as a run of consecutive items
(at least two) whose prices add up, to the cent, to an amount the model read on the same document
in the same pass (e.g. its `subtotal` or `total`, whatever their confidence: the sum is the check);
the earliest such run, then the longest, and the items around it are dropped; the amount it adds up
to is kept too, whatever its confidence (`min_confidence=1.0` keeps nothing else). What the model gets
right this way are the list's boundaries on real documents, where its errors are (docs/ITEMS.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipkie.data.words import read_words
from pipkie.decoding.types import amount_cents
from pipkie.io.document import Document
from pipkie.io.ocr_folder import write_json_atomic
from pipkie.schema import KeySchema, SchemaError

MANIFEST = "labels.jsonl"
DOCS = "docs"  # the labelled documents' sub-folder (the summary beside it is no document)
SUMMARY = "label.json"


def _key_group(schema: KeySchema) -> str:
    return ",".join([k.name for k in schema.keys] + [g.spec(required=False) for g in schema.groups])


def manifest_name(shard: tuple[int, int] = (0, 1)) -> str:
    """`labels.jsonl`, or `labels-{i}of{n}.jsonl` for shard i of n (each process appends to its own)."""
    i, n = shard
    return MANIFEST if n == 1 else f"labels-{i}of{n}.jsonl"


def manifest_rows(out: Path) -> list[dict]:
    """Every row of the manifests in `out` (all shards'; a torn line is skipped)."""
    rows = []
    for path in sorted(Path(out).glob("labels*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write: that document is labelled again
    return rows


def done_groups(out: Path) -> dict[str, set[str]]:
    """Document id -> the key groups already labelled (from the manifests; a torn line is ignored)."""
    done: dict[str, set[str]] = {}
    for row in manifest_rows(out):
        done.setdefault(row["id"], set()).add(row["keys"])
    return done


def _torn(path: Path) -> bool:
    """The file's last line has no newline (a run killed while writing it)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def write_doc(path: Path, doc: Document, fields: dict[str, str | list[str]]) -> None:
    """Add `fields` (a value, or a list column's values) to the document stored at `path` (or to
    `doc`), atomically (temporary name, rename)."""
    if path.exists():
        record = json.loads(path.read_text(encoding="utf-8"))
    else:
        record = {**doc.to_dict(), "normalized": True, "fields": {}}
    record["fields"].update({k: v if isinstance(v, list) else [v] for k, v in fields.items()})
    write_json_atomic(path, record)


def drop_fields(path: Path, prefix: str) -> None:
    """Take the fields whose names start with `prefix` out of the document stored at `path` (a rerun
    replaces its own labels and keeps another labeller's); the file goes when no field is left."""
    if not path.exists():
        return
    record = json.loads(path.read_text(encoding="utf-8"))
    record["fields"] = {k: v for k, v in record["fields"].items() if not k.startswith(prefix)}
    if record["fields"]:
        write_json_atomic(path, record)
    else:
        path.unlink()


def summed_run(prices: list[int | None], targets: set[int]) -> tuple[int, int, int] | None:
    """(start, end, target) of the earliest, then longest, run of at least two consecutive prices (in
    cents, None: not an amount) and the one of `targets` it adds up to; None when there is none."""
    targets = {t for t in targets if t}
    for start in range(len(prices)):
        best, total = None, 0
        for end in range(start, len(prices)):
            if prices[end] is None:
                break
            total += prices[end]
            if end > start and total in targets:
                best = (start, end + 1, total)
        if best:
            return best
    return None


def _check_lists(schema: KeySchema, sum_to: tuple[str, ...]) -> None:
    """Lists are labelled only with `sum_to` flat keys of the same schema, one list with a `price`
    field and item fields a training mixture reads (`pipkie.train.keys.ITEM_FIELDS`)."""
    from pipkie.train.keys import ITEM_FIELDS

    if not schema.groups:
        if sum_to:
            raise SchemaError("sum_to checks a list's prices: ask for one, e.g. items[name,price:money]")
        return
    if not sum_to:
        raise SchemaError(
            "a list is labelled only when its prices add up to an amount of the same answer: "
            "give sum_to (e.g. --sum-to subtotal,total with those keys asked)"
        )
    if len(schema.groups) > 1:
        raise SchemaError("label one list at a time")
    missing = set(sum_to) - {k.name for k in schema.keys}
    if missing:
        raise SchemaError(f"sum_to names keys that are not asked: {', '.join(sorted(missing))}")
    fields = [f.name for f in schema.groups[0].fields]
    odd = [f for f in fields if f not in ITEM_FIELDS]
    if odd or "price" not in fields:
        raise SchemaError(
            f"a labelled list's fields are {', '.join(ITEM_FIELDS)} with price among them (got {', '.join(fields)})"
        )


def doc_file_name(doc_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in doc_id) + ".json"


def _list_fields(res, group, sum_to: tuple[str, ...]) -> tuple[dict, dict[str, list[str]], str | None]:
    """A decoded list's manifest entry and, when a run of its items adds up to one of the `sum_to`
    amounts read in the same answer, that run as `items.<field>` columns ("" for an unknown value)
    and the key whose amount it adds up to (the first of `sum_to` with that amount)."""
    items = [{n: x.value for n, x in it.items()} for it in res.fields[group.name]]
    amounts = {k: amount_cents(res.fields[k].value) for k in sum_to if k in res.fields}
    run = summed_run([amount_cents(it.get("price")) for it in items], set(amounts.values()) - {None})
    entry = {"items": items, "kept": list(run[:2]) if run else None}
    if run is None:
        return entry, {}, None
    start, end, total = run
    chosen = items[start:end]
    matched = next(k for k, a in amounts.items() if a == total)
    return entry, {f"items.{f.name}": [it.get(f.name) or "" for it in chosen] for f in group.fields}, matched


def label_folder(
    extractor,
    src: str | Path,
    out: str | Path,
    *,
    keys: str | KeySchema,
    min_confidence: float = 0.9,
    store_as: dict[str, str] | None = None,
    sum_to: tuple[str, ...] = (),
    batch_size: int = 4,
    limit: int | None = None,
    shard: tuple[int, int] = (0, 1),
    progress: bool = True,
) -> dict:
    """Label every document of `src` not yet labelled with these keys; returns counts per key.

    `store_as` renames fields on the way out (`{"company": "store_name"}`: ask the model the key it
    reads best, store it under the training data's canonical name, `pipkie.train.keys.ALIASES`).
    `sum_to`: the flat keys whose amounts a list's prices must add up to (module docstring); the
    list is stored as `items.<field>` columns, as the readers store line items. `shard=(i, n)`: only
    every n-th document from the i-th, its rows in its own manifest (n processes use n cores)."""
    if not 0.0 < min_confidence <= 1.0:
        raise ValueError(f"min_confidence must be in (0, 1], got {min_confidence}")
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    schema = keys if isinstance(keys, KeySchema) else KeySchema.resolve(keys)
    sum_to = tuple(sum_to)
    _check_lists(schema, sum_to)
    store_as = store_as or {}
    unknown = set(store_as) - {k.name for k in schema.keys}
    if unknown:
        raise ValueError(f"store_as names keys that are not asked: {', '.join(sorted(unknown))}")
    src, out = Path(src), Path(out)
    (out / DOCS).mkdir(parents=True, exist_ok=True)
    group = _key_group(schema)
    lists = {g.name for g in schema.groups}
    done = done_groups(out)
    docs = [
        d
        for j, d in enumerate(read_words(src, "all", limit=limit))
        if j % count == index and group not in done.get(d.id, set())
    ]
    kept = {store_as.get(k.name, k.name): 0 for k in schema.keys}
    kept.update({g.name: 0 for g in schema.groups})  # documents whose list was kept
    stats = {"documents": len(docs), "labelled": 0, "values": 0, "kept": kept}
    from tqdm import tqdm

    bar = tqdm(total=len(docs), unit="doc", file=sys.stderr, disable=not progress, mininterval=10, desc="label")
    path = out / manifest_name(shard)
    with open(path, "a", encoding="utf-8") as manifest:
        if _torn(path):
            manifest.write("\n")  # end the line a kill tore, so that the next row starts on its own line
        for i in range(0, len(docs), batch_size):
            chunk = docs[i : i + batch_size]
            results = extractor.extract_many(chunk, schema=schema, batch_size=batch_size)
            for doc, res in zip(chunk, results):
                answers, fields, summed = {}, {}, set()
                for g in schema.groups:
                    answers[g.name], fields_of_list, matched = _list_fields(res, g, sum_to)
                    if fields_of_list:
                        fields.update(fields_of_list)
                        kept[g.name] += 1
                        summed.add(matched)  # the amount the items add up to is checked as they are
                for name, f in res.fields.items():
                    if name in lists:
                        continue
                    stored = store_as.get(name, name)
                    answers[stored] = [f.value, f.confidence]
                    if f.value is not None:
                        stats["values"] += 1
                        if (f.confidence >= min_confidence and not f.truncated) or name in summed:
                            fields[stored] = f.value
                            kept[stored] += 1
                if fields:
                    write_doc(out / DOCS / doc_file_name(doc.id), doc, fields)
                    stats["labelled"] += 1
                manifest.write(json.dumps({"id": doc.id, "keys": group, "answers": answers}, ensure_ascii=False) + "\n")
                manifest.flush()
            bar.update(len(chunk))
    bar.close()
    summary_path = out / SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"runs": []}
    summary["runs"].append(
        {
            "model": str(extractor.name),
            "keys": group,
            "min_confidence": min_confidence,
            "store_as": store_as,
            **({"sum_to": list(sum_to)} if sum_to else {}),
            **({"shard": f"{index}/{count}"} if count > 1 else {}),
            **stats,
        }
    )
    summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    return stats
