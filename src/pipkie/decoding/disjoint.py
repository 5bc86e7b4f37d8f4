"""One printed word answers one key: where two keys' values share words of the document, the one
that runs into the other gives them up.

Key information extraction labels each word of a document with at most one key (the BIO tagging of
token classification, the boxes of SROIE and WildReceipt). A parallel decoder reads every key in the
same pass and does not see the others' answers, so a value can run on into the next key's lines: a
store name that goes on into the address (`Goldbergs#88 HartsfieldJackson InternationalAirport`
while the address is `HartsfieldJackson InternationalAirport Atlanta,GA`), or over all of it.

`disjoint` looks at each pair of flat values found exactly once in the document text (words matched
across any whitespace, as `pipkie.decoding.snap` does): when one starts before the other, reaches
into it (runs on into it, or over all of it) and is read with no more confidence than it, it ends
where the other starts. Values run forward, past their end, far more than they start early, so the
one that started first is the one that ran on; and a value read with less confidence than the one
it reaches into (an untyped `date` that answers an address line) does not cut it. Two values that
start at the same word (the same words, or one the first part of the other) are left as they are:
nothing says which is right.
Values that occur more than once, or not at all (normalised, generated), and list items are left
alone. Confidences stay. `Decoder.__call__` applies it to every decoder alike, after types; the
evaluation fingerprint names it. Measured on the development sets in docs/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import re

from pipkie.decoding.snap import words_regex

DISJOINT = "disjoint-1"  # names this rule in evaluation fingerprints (`pipkie.eval.store`)


def _place(value: str, text: str) -> tuple[int, int] | None:
    """(start, end) of the value's only occurrence in the text, whole words, any whitespace between
    them; None when it occurs more than once, not at all, or inside a longer word."""
    words = value.split()
    if not words:
        return None
    pattern = r"(?<!\S)" + words_regex(words) + r"(?!\S)"
    found = [m.span() for m in re.finditer(pattern, text)]
    return found[0] if len(found) == 1 else None


def _words_in(text: str, start: int, end: int) -> str:
    """The text's words between two offsets, joined by single spaces."""
    return " ".join(text[start:end].split())


def _cut(a: tuple[int, int], b: tuple[int, int], a_conf: float, b_conf: float) -> int | None:
    """Where value A ends after giving up the words it shares with B: at B's start when A starts
    before B, reaches into it and is not more confident; None when A keeps its place."""
    (a0, a1), (b0, _) = a, b
    return b0 if a0 < b0 < a1 and a_conf <= b_conf else None


def disjoint(pred: dict, text: str) -> dict:
    """One document's results with shared words taken from the value that runs into another (see
    the module docstring); flat values only."""
    places = {}
    for key, r in pred.items():
        value = getattr(r, "value", None)
        if isinstance(value, str) and (place := _place(value, text)) is not None:
            places[key] = place
    out = dict(pred)
    for key, a in places.items():
        conf = pred[key].confidence
        cuts = [
            c
            for other, b in places.items()
            if other != key and (c := _cut(a, b, conf, pred[other].confidence)) is not None
        ]
        if cuts:
            out[key] = dataclasses.replace(pred[key], value=_words_in(text, a[0], min(cuts)))
    return out
