"""Values end where document words end: a value that stops inside a word of the document is
completed to the end of that word.

A parallel decoder decides each value's length in the same pass as its tokens, and a small one
often ends a value a token early (`$60.4` for `$60.44`, `PORKD` for `PORKDUMPLINT1`: values are
whole OCR words or boxes, which WildReceipt writes without spaces). `Decoder.__call__` applies this
to every decoder's answers alike (AR's values rarely end inside a word; the comparison stays fair).

The rule looks only at the value and the document text. A value is cut inside a word when, at every
place it occurs, it ends between two letters, two digits, or `.`/`,` and a digit (`$60.4|4`,
`PORKD|UMPLINT1`, `13.|99`); never at a space, before punctuation (`BHD (`) or between a digit and
a letter (`12/30/2016|FRI`: a user wants the date); when every occurrence continues
into the same completion (the rest of that word), that is the value; when they differ (`$1`
before `$13.99` and `$14.99`), nothing is changed. A value not found in the text (normalised,
generated) is left alone. Confidences stay those of the decoder's choice. Measured on WildReceipt
dev in docs/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import re

_WORD_REST = re.compile(r"\S*")  # the rest of the word: an OCR word/box is what the text separates by spaces
SNAP = "words-1"  # names this rule in evaluation fingerprints (`pipkie.eval.store`)
_INSIDE_NUMBER = ".,"  # `13.` before `99`: a cut inside a number


def _inside(last: str, following: str) -> bool:
    """A cut between these two characters is inside a word: letter|letter, digit|digit, or `.`/`,`
    before a digit (`13.|99`)."""
    return (last.isalpha() and following.isalpha()) or (
        following.isdigit() and (last.isdigit() or last in _INSIDE_NUMBER)
    )


def snap_to_words(value: str | None, text: str) -> str | None:
    """`value` completed to the end of the document word it stops in (see the module docstring)."""
    if not value:
        return value
    completions = set()
    for m in re.finditer(re.escape(value), text):
        end = m.end()
        if end == len(text) or not _inside(value[-1], text[end]):
            return value  # whole somewhere (at a space, before punctuation, `2016` before `FRI`)
        completions.add(value + _WORD_REST.match(text, end).group(0))
        if len(completions) > 1:
            return value
    return completions.pop() if completions else value


def _snapped(result, text: str):
    value = getattr(result, "value", None)
    if not isinstance(value, str):
        return result
    new = snap_to_words(value, text)
    return result if new == value else dataclasses.replace(result, value=new)


def snap_predictions(preds: list[dict], texts: list[str]) -> list[dict]:
    """Every value of every document's prediction (FieldResult, or an ItemsResult's fields) snapped
    to its document's words, in place; returns `preds`."""
    for pred, text in zip(preds, texts):
        for key, result in pred.items():
            items = getattr(result, "items", None)
            if isinstance(items, list):
                for item in items:
                    for name, field in item.items():
                        item[name] = _snapped(field, text)
            else:
                pred[key] = _snapped(result, text)
    return preds
