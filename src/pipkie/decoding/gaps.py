"""Items a list skipped between two it read: lines laid out like their neighbours, read by analogy.

A parallel decoder places a list's items by counting lines in one pass, and a count that slips
skips a line: on WildReceipt dev the shipped round-20 model read 227 of 564 gold items right and
missed 123 *between* two items it read (`1 Caprese 10.00` between `1 BenSPECIAL 12.50` and
`1 PineappleBellin 7.00`; docs/RESULTS.md "Skipped item lines"). A receipt prints its items alike,
so such a line is recognisable by its layout alone:

- a line's *shape* is its words as a sequence of elements: an amount (`12.50`, `$7.00`, `2,40-`),
  a small count (`1`, `2x`), or a run of other words (`Caprese`, `Add Chicken`);
- two consecutive items of the decoded list are *located* when each lies on one line of the
  document text, every value it has being one element of that line (the first such line after the
  previous item's; an item split over two lines, `Name` / `2 @ 3.00  6.00`, is not located);
- a line strictly between two located items whose shape equals one of theirs (the one above
  first) and holds a number is an item the decoder skipped: each of its fields takes the element
  of that line which the neighbour's same field took (a field the neighbour left empty stays
  empty). The filled item's field confidences are the lower of the two neighbours' (a layout rule
  has no probability of its own), and its fields are marked `layout`.

Lines before the first item or after the last are never filled: a `Subtotal 24.45` under the last
item has the shape of `AddChicken 1.00`. Nothing is decoded again (no forward pass). Every decoder
alike (`Decoder.__call__`, after a list's incomplete items are left out), so PIP-vs-AR comparisons
stay fair.
"""

from __future__ import annotations

import re
from dataclasses import replace

from pipkie.decoding.results import FieldResult
from pipkie.model.groups import ItemsResult

GAPS = "gaps-1"  # names this rule in evaluation fingerprints (`pipkie.eval.evaluate`)
_AMOUNT = re.compile(r"^[$€£¥￥]?-?\d{1,7}[.,]\d{2}[-*#A-Z]{0,2}$")  # a flag may follow: `2.05-`, `3.00*`, `53.78A`
_COUNT = re.compile(r"^(\d{1,3}[xX]?|[xX]\d{1,3})$")


def elements(line: str) -> list[tuple[str, str]]:
    """(kind, text) of a line: "amount", "count", or "words" (a run of other words, joined by one space)."""
    out: list[tuple[str, str]] = []
    for tok in line.split():
        kind = "amount" if _AMOUNT.match(tok) else "count" if _COUNT.match(tok) else "words"
        if kind == "words" and out and out[-1][0] == "words":
            out[-1] = ("words", out[-1][1] + " " + tok)
        else:
            out.append((kind, tok))
    return out


def shape(line: str) -> tuple[str, ...]:
    return tuple(kind for kind, _ in elements(line))


def _slice(run: str, value: str) -> tuple[int, int] | None:
    """(words dropped from the start, from the end) of a run of words that leave `value`; the fewest."""
    words, want = run.split(), value.split()
    n = len(want)
    cuts = [(a, len(words) - a - n) for a in range(len(words) - n + 1) if words[a : a + n] == want]
    return min(cuts, key=sum) if cuts else None


def _mapping(item: dict[str, FieldResult], line: str) -> dict[str, tuple[int, int, int] | None] | None:
    """Field -> (element of `line`, words dropped from its start, from its end) its value is (None: no
    value), or None when a value is in none of them. A run of words may hold words that are not the
    value (`GyrosFolie a`: a unit mark; `WOWPERFF T`: a tax flag; `72560616931 HANDTIEDROSES`: a code)."""
    runs = [text for _, text in elements(line)]
    out: dict[str, tuple[int, int, int] | None] = {}
    for name, result in item.items():
        if result.value is None:
            out[name] = None
            continue
        value = " ".join(result.value.split())
        found = [(e, *cut) for e, run in enumerate(runs) if (cut := _slice(run, value)) is not None]
        if not found:
            return None
        out[name] = min(found, key=lambda f: f[1] + f[2])
    return out if any(v is not None for v in out.values()) else None


def _locate(items: list[dict[str, FieldResult]], lines: list[str]) -> list[tuple[int, dict] | None]:
    """Per item, (line index, field -> element) of the first line after the previous located item's
    that holds all its values as elements; None when there is none."""
    out, after = [], -1
    for item in items:
        found = None
        for i in range(after + 1, len(lines)):
            m = _mapping(item, lines[i])
            if m is not None:
                found = (i, m)
                after = i
                break
        out.append(found)
    return out


def _read(line: str, mapping: dict, above: dict, below: dict) -> dict[str, FieldResult] | None:
    """The item on a skipped `line` read as the neighbour's `mapping` says; None when a run of words is
    too short for the words the neighbour dropped from it."""
    texts = [text for _, text in elements(line)]
    item = {}
    for name, where in mapping.items():
        value = None
        if where is not None:
            e, start, end = where
            words = texts[e].split()
            if len(words) <= start + end:
                return None
            value = " ".join(words[start : len(words) - end])
        confs = [n[name].confidence for n in (above, below) if name in n and n[name].value is not None]
        item[name] = FieldResult(value, min(confs) if (confs and value is not None) else 0.0, layout=True)
    return item


def fill_gaps(items: list[dict[str, FieldResult]], text: str) -> list[dict[str, FieldResult]]:
    """The decoded list `items` (in line order) with the lines it skipped between two of its items
    inserted (module docstring); `text` is the document text the decoder read."""
    lines = text.splitlines()
    where = _locate(items, lines)
    out = []
    for k, item in enumerate(items):
        out.append(item)
        if k + 1 == len(items) or where[k] is None or where[k + 1] is None:
            continue
        (a, map_a), (b, map_b) = where[k], where[k + 1]
        neighbours = ((shape(lines[a]), map_a), (shape(lines[b]), map_b))  # the one above first
        for j in range(a + 1, b):
            s = shape(lines[j])
            if "amount" not in s and "count" not in s:
                continue
            mapping = next((m for like, m in neighbours if like == s), None)
            if mapping is not None and (read := _read(lines[j], mapping, item, items[k + 1])) is not None:
                out.append(read)
    return out


def fill_prediction(pred: dict, text: str) -> dict:
    """One document's results with every list's skipped lines filled in (`fill_gaps`); flat keys as they are."""
    return {
        k: replace(v, items=fill_gaps(v.items, text)) if isinstance(v, ItemsResult) and v.items else v
        for k, v in pred.items()
    }
