"""A value never ends in a label: a word that ends with `:` names the value printed after it.

Receipts and forms print a label before its value (`Tel: 0143263304`, `SUBTOTAL: 24.45`), so a value
whose last word ends with a colon was read one word too far, into the next field's label (`12 Main
St Tel:`), or is a label alone (`Date:` answered for an address on a receipt that prints none). No
gold value of the data sets here ends that way (0 of 85,722: SROIE, WildReceipt, Kleister-NDA and the
generated sets; docs/RESULTS.md "A value never ends in a label").

`drop_labels` (every decoder alike, `Decoder.__call__`, after the type checks and the skipped lines'
fill, `pipkie.decoding.gaps`, so that a summary line filled in by its neighbours' layout goes too): a
flat value loses its trailing words that end with `:`, and one left empty answers `unknown` (its
confidence kept, as the type checks keep theirs). A list item with a field that is a label alone is
a summary line printed under the items (`SUBTOTAL: 24.45`, `KOKKU: 63.00`), not an item, and is left
out. Plain Python.
"""

from __future__ import annotations

import dataclasses

LABELS = "labels-1"  # names this rule in evaluation fingerprints (`pipkie.eval.evaluate`)


def is_label(word: str) -> bool:
    """A word that names something and ends with a colon (`Tel:`, `SUBTOTAL:`, `1:`): a label, not a
    value. A run of punctuation (`::::`) names nothing and is left to the other rules."""
    return word.endswith(":") and any(c.isalnum() for c in word)


def without_label(value: str | None) -> str | None:
    """`value` without its trailing label words (`12 Main St Tel:` -> `12 Main St`); None when nothing
    but labels is left (`Date:`)."""
    if value is None:
        return None
    words = value.split()
    n = len(words)
    while n and is_label(words[n - 1]):
        n -= 1
    if n == len(words):
        return value
    return " ".join(words[:n]) or None


def _summary_line(item: dict) -> bool:
    """An item with a field that is a label alone (`SUBTOTAL:`)."""
    return any(r.value is not None and without_label(r.value) is None for r in item.values())


def drop_labels(pred: dict) -> dict:
    """One document's results with trailing labels taken off flat values and summary lines out of
    lists (module docstring)."""
    out = dict(pred)
    for key, r in pred.items():
        items = getattr(r, "items", None)
        if items is not None:
            kept = [it for it in items if not _summary_line(it)]
            if len(kept) != len(items):
                out[key] = dataclasses.replace(r, items=kept)
        elif isinstance(getattr(r, "value", None), str) and (v := without_label(r.value)) != r.value:
            out[key] = dataclasses.replace(r, value=v, truncated=False if v is None else r.truncated)
    return out
