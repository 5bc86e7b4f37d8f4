"""Values end where document words end: a value that stops inside a word of the document is
completed to the end of that word, or, when that word is a short spill onto the next line, cut
before it.

A parallel decoder decides each value's length in the same pass as its tokens, and a small one
often ends a value a token early (`$60.4` for `$60.44`, `PORKD` for `PORKDUMPLINT1`: values are
whole OCR words or boxes, which WildReceipt writes without spaces) or a token late, reaching into
the line below (`THE ROUND TOWER K` where the next line is `KELLSCO.MEATH`). `Decoder.__call__`
applies this to every decoder's answers alike (AR's values rarely end inside a word; the comparison
stays fair).

The rule looks only at the value and the document text, matching the value's words across any
whitespace (a value copied over a line break says ` ` where the text says a newline). A value is cut
inside a word when, at every place it occurs, it ends between two letters, two digits, `.`/`,` and a
digit, or an apostrophe and a letter (`$60.4|4`, `PORKD|UMPLINT1`, `13.|99`, `ILIO'|S`); never at
a space, before punctuation (`BHD (`) or between a digit and a letter (`12/30/2016|FRI`: a user
wants the date). When every occurrence continues into the same rest of the word, the value is
completed with it, except when that last word begins a new line and less than half of it was read
(`K` of `KELLSCO.MEATH`): then the value ends at the line before (`THE ROUND TOWER`). When the
occurrences differ (`$1` before `$13.99` and `$14.99`), nothing is changed. A value not found in
the text (normalised, generated) is left alone. Confidences stay those of the decoder's choice.
Measured on WildReceipt dev in docs/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import re

_WORD_REST = re.compile(r"\S*")  # the rest of the word: an OCR word/box is what the text separates by spaces
SNAP = "words-2"  # names this rule in evaluation fingerprints (`pipkie.eval.store`)
_INSIDE_NUMBER = ".,"  # `13.` before `99`: a cut inside a number
_SPILL = 0.5  # a last word on a new line of which less than this share was read is cut, not completed


def _inside(last: str, following: str) -> bool:
    """A cut between these two characters is inside a word: letter|letter, digit|digit, `.`/`,`
    before a digit (`13.|99`), or an apostrophe before a letter (`ILIO'|S`)."""
    return (following.isalpha() and (last.isalpha() or last == "'")) or (
        following.isdigit() and (last.isdigit() or last in _INSIDE_NUMBER)
    )


def words_regex(words: list[str]) -> str:
    """A regex of these words with any whitespace between them: a value copied over a line break
    says ` ` where the text has a newline (also `pipkie.decoding.disjoint`'s way to place a value)."""
    return r"\s+".join(re.escape(w) for w in words)


def _pattern(words: list[str]) -> re.Pattern:
    """The value's words separated by any whitespace; the last separator captured (a line break?)."""
    head = words_regex(words[:-1])
    return re.compile(f"{head}(\\s+){re.escape(words[-1])}" if head else re.escape(words[-1]))


def snap_to_words(value: str | None, text: str) -> str | None:
    """`value` completed to the end of the document word it stops in, or cut before a short spill
    onto the next line (see the module docstring)."""
    if not value or not value.strip():
        return value
    words = value.split()
    endings = set()  # (rest of the word, whether the last word begins a new line)
    for m in _pattern(words).finditer(text):
        end = m.end()
        if end == len(text) or not _inside(words[-1][-1], text[end]):
            return value  # whole somewhere (at a space, before punctuation, `2016` before `FRI`)
        endings.add((_WORD_REST.match(text, end).group(0), len(words) > 1 and "\n" in m.group(1)))
        if len(endings) > 1:
            return value
    if not endings:
        return value
    rest, new_line = endings.pop()
    if new_line and len(words[-1]) < _SPILL * (len(words[-1]) + len(rest)):
        return " ".join(words[:-1])
    return value.rstrip() + rest


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
