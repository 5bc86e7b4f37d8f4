"""`pipkie label-items`: line items of real receipts found by arithmetic alone, without a model.

    stats = label_items_folder("runs/ocr/wildreceipt_unlabeled", "runs/pseudo/wildreceipt_sums")

A receipt's item lines end with their amounts, and the amounts add up to the subtotal or total
printed below them. Among a document's lines (`serialize`, the reading order the models see), a run
of at least `MIN_ITEMS` consecutive lines that each end in an amount with cents (`12.00`, `3,70`,
`$13.99`, `£5.95`) and none of which is a summary line (`SUMMARY`: total, tax, service, change, cash,
... in the languages of WildReceipt's receipts, found inside words too, since receipts glue them:
`#SUBTOTAL28.00`; an item named `Cornetto` then ends a run: fewer lists, not wrong ones), whose
amounts add up to the cent to the amount of one of the next `AHEAD` lines that end in an amount, is
a list; the longest such run of a document is kept. One item per line: its price is the line's
amount; its name the words before the amount, without the numbers at either end (a number before
the name is its quantity, a small whole number after it too; other trailing numbers are a unit price
or a code).

Why not the model's own lists (`pipkie label --sum-to`): that check keeps a list only when the model
read all of it, so it keeps the lists the model already reads: 93 of the 1,297 unlabelled WildReceipt
photos, 3.4 items each against WildReceipt dev's 5.5, and weighting them up taught lists to stop
earlier (docs/RESULTS.md "Rounds 16 and 17"). This check does not depend on where a model stops.
Chosen on WildReceipt dev, gold stripped (`scripts/check_item_labels.py sums`; numbers in
docs/RESULTS.md "Item lists that add up"). Prices are copied as printed, so a label is a copy target
of the document's own words, OCR errors included.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from pipkie.data.words import read_words
from pipkie.decoding.types import amount_cents
from pipkie.io.document import serialize
from pipkie.train.label import DOCS, doc_file_name, drop_fields, write_doc

MIN_ITEMS = 2  # items of a run (two lines adding up to a third is already rare by chance with cents)
AHEAD = 2  # the sum is one of this many amount lines after the run (a subtotal, or the total after it)
SUMMARY_FILE = "label-items.json"
# the fields stored: a quantity is read right 90% of the time from WildReceipt's words but 68% from
# rapidocr's (split or glued numbers), names and prices 97-100%; `pipkie label --sum-to` keeps the
# same two fields
LABELLED = ("name", "price")
# the last word of an amount line: an amount with cents (optionally signed, in brackets or a currency)
CENTS = re.compile(r"\d[.,]\d\d-?\)?$")
NUMBER = re.compile(r"^[@x*]?[$€£]?\d+(?:[.,]\d+)?[xX]?$")  # a quantity, unit price or code
SUMMARY = re.compile(
    r"total|tax|vat|gst|pst|hst|service|svc|tip|round|discount|change|cash|amount|mwst|iva|tva|btw|summe"
    r"|subtl|subttl|netto|balance|due|paid|card|visa",
    re.IGNORECASE,
)


def line_amount(line: str) -> int | None:
    """The amount in cents a line ends with (a word of its own after at least one other), else None."""
    words = line.split()
    if len(words) < 2 or not CENTS.search(words[-1]):
        return None
    return amount_cents(words[-1])


def line_item(line: str) -> dict[str, str | None]:
    """An amount line as an item: name, quantity and price (module docstring)."""
    words = line.split()
    price, words, quantity = words[-1], words[:-1], None
    while words and NUMBER.match(words[0]):
        quantity, words = quantity or words[0], words[1:]
    while words and NUMBER.match(words[-1]):
        tail, words = words[-1], words[:-1]
        if quantity is None and re.fullmatch(r"\d{1,2}", tail):
            quantity = tail
    return {"name": " ".join(words) or None, "quantity": quantity, "price": price}


def summed_lines(lines: list[str]) -> tuple[list[int], int] | None:
    """(the item lines, the line of the amount they add up to) of the longest run of a document's
    lines (module docstring), None when no run adds up."""
    amounts = [line_amount(x) for x in lines]
    summary = [bool(SUMMARY.search(x)) for x in lines]  # once per line, not once per run tried
    at = [i for i, a in enumerate(amounts) if a is not None]
    best = None
    for first in range(len(at)):
        total, members = 0, []
        for j in range(first, len(at)):
            i = at[j]
            if (members and i != members[-1] + 1) or summary[i]:
                break  # a run is consecutive lines, none of them a summary line
            total += amounts[i]
            members.append(i)
            if len(members) < MIN_ITEMS or total <= 0:
                continue
            target = next((t for t in at[j + 1 : j + 1 + AHEAD] if amounts[t] == total), None)
            if target is not None and (best is None or len(members) > len(best[0])):
                best = (list(members), target)
    return best


def label_items_folder(src: str | Path, out: str | Path, *, limit: int | None = None, progress: bool = True) -> dict:
    """Write every document of `src` (JSON words, `pipkie ocr`) that has a run of items adding up as a
    labelled document `{out}/docs/<id>.json` with `items.name` / `items.price` columns (`LABELLED`;
    read back by `read_dataset("words", out, "docs")`, as `pipkie label` writes them). Other fields
    of a document already in `out` (`pipkie label`'s keys) are kept, so both labellers can fill one
    folder; a rerun replaces the lists written before, and a document left with no field is
    removed. Returns and records (`{out}/label-items.json`) the counts."""
    from tqdm import tqdm

    src, out = Path(src), Path(out)
    docs = list(read_words(src, "all", limit=limit))
    (out / DOCS).mkdir(parents=True, exist_ok=True)
    stats = {"documents": len(docs), "labelled": 0, "items": 0}
    for doc in tqdm(docs, unit="doc", file=sys.stderr, disable=not progress, mininterval=10, desc="label-items"):
        lines = serialize(doc).split("\n")
        run = summed_lines(lines)
        path = out / DOCS / doc_file_name(doc.id)
        drop_fields(path, "items.")  # a rerun replaces the lists it wrote; `pipkie label`'s fields stay
        if run is None:
            continue
        items = [line_item(lines[i]) for i in run[0]]
        write_doc(path, doc, {f"items.{f}": [it[f] or "" for it in items] for f in LABELLED})
        stats["labelled"] += 1
        stats["items"] += len(items)
    record = {"src": str(src), "fields": list(LABELLED), "min_items": MIN_ITEMS, "ahead": AHEAD, **stats}
    (out / SUMMARY_FILE).write_text(json.dumps(record, indent=2))
    return stats
