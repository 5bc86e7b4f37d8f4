"""Counterfactual erasure: a real document with one field's value taken out, asked for that key.

Receipts often lack a key a user asks for (a WildReceipt dev receipt in five prints no store
address), and the model must answer `unknown` there. Generated receipts that lack an address teach
little about real ones, and the copy head, trained on real receipts that always have one, learnt to
point at whatever sits where an address usually is (a cashier's name, the date line). Erasing the
value's words from a labelled document gives the contrastive pair the model needs: the same
receipt with the value (copy it) and without it (answer `unknown`), everything else unchanged.

    doc2 = erase_field(doc, "address")   # None when the value's words cannot be found

A value's words are found by their normalised text (case-folded, alphanumerics only): every token
that matches a token of the value and sits in a run of at least two such tokens (one, for a value of
one token), so an address's words go and a lone "JALAN" elsewhere stays. The erasure is kept only
when it took out most of the value's tokens and the value no longer occurs in the document's text.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from pipkie.io.document import Document, serialize

MIN_COVER = 0.8  # share of the value's tokens that must be taken out of the document


def _norm(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.casefold())


def erase_field(doc: Document, key: str) -> Document | None:
    """A copy of `doc` without the words of field `key`'s value(s) and without that field, or None
    when they cannot be found well enough (`MIN_COVER`) or the value still occurs afterwards.

    Words may be whole OCR lines (SROIE's boxes): the value's tokens are taken out of a word's text,
    and a word left with no text goes."""
    values = [v for v in doc.fields.get(key) or [] if v.strip()]
    if not values or doc.text is not None or not doc.words:
        return None
    tokens = {_norm(t) for v in values for t in v.split()} - {""}
    if not tokens:
        return None
    run = 1 if max(len(v.split()) for v in values) == 1 else 2
    flat = [(i, t) for i, w in enumerate(doc.words) for t in w.text.split()]  # (word, token) in reading order
    norms = [_norm(t) for _, t in flat]
    real = [j for j, n in enumerate(norms) if n]  # tokens with letters or digits; punctuation rides along
    drop: set[int] = set()
    a = 0
    while a < len(real):  # runs of the value's tokens, kept when long enough
        b = a
        while b < len(real) and norms[real[b]] in tokens:
            b += 1
        if b - a >= run:
            drop.update(range(real[a], real[b - 1] + 1))  # with the punctuation between them
        a = max(b, a + 1)
    if len({norms[j] for j in drop} & tokens) < MIN_COVER * len(tokens):
        return None
    kept: dict[int, list[str]] = {}
    for j, (i, t) in enumerate(flat):
        if j not in drop:
            kept.setdefault(i, []).append(t)
    words = [replace(w, text=" ".join(kept[i])) for i, w in enumerate(doc.words) if i in kept]
    out = replace(doc, words=words, fields={k: v for k, v in doc.fields.items() if k != key})
    rest = _norm(serialize(out))
    if any(len(_norm(v)) >= 4 and _norm(v) in rest for v in values):
        return None
    return out


def maybe_erase(
    doc: Document, rng: random.Random, share: float, keys: tuple[str, ...] = ()
) -> tuple[Document, str | None]:
    """With probability `share`, `doc` with one of its fields (among `keys`, default all flat ones)
    erased, and that key; else (doc, None). No draw is made at share 0."""
    if share <= 0 or rng.random() >= share:
        return doc, None
    present = [k for k in doc.fields if doc.fields[k] and not k.startswith("items.") and (not keys or k in keys)]
    if not present:
        return doc, None
    key = rng.choice(sorted(present))
    erased = erase_field(doc, key)
    return (erased, key) if erased is not None else (doc, None)
