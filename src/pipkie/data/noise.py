"""OCR-like character noise for generated documents: confusions an OCR engine makes (`0`/`O`,
`1`/`l`, `5`/`S`, …), applied to the words a model reads and never to the ground truth."""

from __future__ import annotations

import random

_CONFUSIONS = {
    "O": "0",
    "0": "O",
    "I": "1",
    "l": "1",
    "1": "l",
    "S": "5",
    "5": "S",
    "B": "8",
    "8": "B",
    "Z": "2",
    "G": "6",
    ".": ",",
    ",": ".",
    "E": "F",
    "rn": "m",
}


def ocr_noise(text: str, rng: random.Random, p: float) -> str:
    """OCR-like character errors, each character hit with probability p (confusion, drop, split)."""
    out = []
    for ch in text:
        if rng.random() >= p:
            out.append(ch)
            continue
        roll = rng.random()
        if ch in _CONFUSIONS and roll < 0.6:
            out.append(_CONFUSIONS[ch])
        elif roll < 0.8:
            continue  # dropped
        else:
            out.append(ch + " " if ch != " " else "")
    return "".join(out).strip() or text
