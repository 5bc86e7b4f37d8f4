"""Where each field of a list's items starts, in the one pass: the copy head read as lines.

A list's items are lines of the document (`pipkie.model.groups`). After the forward pass, the copy
head gives every field of every item a start distribution over the document (`copyhead`); reading
each slot's argmax separately mixes tokens from different lines (`1 ,0` for `12,00`, `$` for
`$13.99`) and lets an item's price come from another item's line. `ItemPlacer` decodes the fields
of a row's items in template order (item by item, field by field) under four rules, all on the
same pass's outputs (no extra forward call):

- order: item i's field starts after the word where item i − 1's same field starts
  (`groups.MONOTONE_ITEMS`); when that word is the document's last, nothing is left: a first
  field then ends the list, another field has no value;
- one line per item (`SAME_LINE`): an item's later fields start on the line where its first field
  starts, outside the first field's word; when nothing of that line is left, on the next line
  (a name on one line, `2 @ 3.00  6.00` below it); when neither has any, anywhere;
- whole words (`WORD_START`): a start inside a word (same line, no leading space, not after a
  bare space) moves back to the word's first token, as `snap` completes a word's end;
- one span (`COPY_SPAN`): when the copy carries the field (mean LM gate over its slots below
  `COPY_GATE`), its value is the document's tokens from that start: as many as the slots gave
  (+ the tokens moved back over), to the end of the word they stop in (`18` → `180.00`, where a
  text-level `snap` cannot tell which `18` was meant), never past the line's end (nor the
  budget). Its confidence is the copy head's probability of that start and the slots' length,
  spread over the slots so that the field's geometric mean is p^(1/(L+1)). A field whose first
  slot says `<|pip_end|>` (the list's "no more items", or an empty column) keeps the slots' answer;
- a majority to stop (`read_on`): a group ends the list only when its "no more items" has
  probability `STOP_P` (one half) or more; below it, the group is read as an item (its placed words),
  and the next group decides again. Trained lists stop on real receipts before their last item,
  at lower stop probabilities than the lists that end right (docs/RESULTS.md "Lists that stop early").

Lines are the breaks in the copy stream (line-break tokens are not in it: `copy_stream`).
Chosen on WildReceipt dev (100 receipts, round-3 model; numbers in docs/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipkie.model import groups as item_groups
from pipkie.model.template import FieldSlots

SAME_LINE = True
WORD_START = True
COPY_SPAN = True
COPY_GATE = 0.5  # a span replaces the slots' answer when the mean LM gate over it is below this
ITEM_RULES = "order-line-word-span-3-klines-readon"  # names these rules in evaluation fingerprints
STOP_P = 0.5  # a list ends at a group that says "no more items" with at least this probability


def stream_lines(stream: torch.Tensor) -> torch.Tensor:
    """(M,) input positions of the copy stream -> (M,) line number of each (a gap is a line break)."""
    if len(stream) == 0:
        return stream.new_zeros(0)
    breaks = torch.cat([stream.new_zeros(1), (stream[1:] != stream[:-1] + 1).long()])
    return breaks.cumsum(0)


def line_end(lines: torch.Tensor, m: int) -> int:
    """The stream index just past the line of index m (`lines` from `stream_lines`: non-decreasing)."""
    return int((lines <= lines[m]).sum())


@dataclass
class Placement:
    start: int  # stream index of the value's first token (its word's first token)
    back: int = 0  # tokens moved back over from the start distribution's argmax (`WORD_START`)
    line_end: int = 0  # stream index just past the start's line: a list's value never crosses a line
    p_start: float = 0.0  # the copy head's probability of the argmax start
    p_len: torch.Tensor | None = None  # (K,) its length distribution from that start
    ended: bool = False  # nothing of the document is left past the previous item: no value


@dataclass
class ItemPlacer:
    """One row's list fields: `allow(f)` before the field's copy distributions, `place(...)` after,
    `write_span(...)` once the slots have their tokens."""

    stream: torch.Tensor  # (M,) input positions of the copy stream
    stream_ids: torch.Tensor  # (M,) their token ids
    word_initial: set[int]  # token ids that begin with whitespace (`TemplateBuilder.space_ids`)
    blank: set[int] = field(default_factory=set)  # those made of whitespace only
    lines: torch.Tensor = field(init=False)  # (M,) line number of each stream index
    word_starts: torch.Tensor = field(init=False)  # (M,) the first stream index of each token's word
    word_ends: torch.Tensor = field(init=False)  # (M,) the last stream index of each token's word
    previous: dict[tuple[str, str], int] = field(default_factory=dict)  # (list, field) -> its word's end
    anchor: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)  # -> (line, start, end)
    ended: set[str] = field(default_factory=set)  # fields with nothing left to start on

    def __post_init__(self):
        self.lines = stream_lines(self.stream)
        m = len(self.stream)
        inside = [self._inside(j) for j in range(m)]
        starts, ends = list(range(m)), list(range(m))
        for j in range(1, m):
            if inside[j]:
                starts[j] = starts[j - 1]
        for j in range(m - 2, -1, -1):
            if inside[j + 1]:
                ends[j] = ends[j + 1]
        self.word_starts = torch.tensor(starts, dtype=torch.long)
        self.word_ends = torch.tensor(ends, dtype=torch.long)

    def allow(self, f: FieldSlots) -> torch.Tensor | None:
        """(M,) where field f may start (None: anywhere, or nowhere when the previous item's same
        field took the document's last word: then `place` says `ended`)."""
        m = len(self.stream)
        idx = torch.arange(m)
        ok = torch.ones(m, dtype=torch.bool)
        prev = self.previous.get((f.group, f.field))
        if item_groups.MONOTONE_ITEMS and prev is not None:
            if prev >= m - 1:
                self.ended.add(f.key)
                return None
            ok &= idx > prev
        a = self.anchor.get((f.group, f.item))
        if SAME_LINE and a is not None:
            line, s, e = a
            rest = ok & ~((idx >= s) & (idx < e))
            for want in (line, line + 1):
                here = rest & (self.lines == want)
                if here.any():
                    return here
        return ok

    def _inside(self, m: int) -> bool:
        """Token m continues the word of token m − 1: same line, no leading whitespace, and m − 1 is
        not a bare space (`TemplateBuilder.space_ids`: SmolLM2 writes " 12" as " ", "1", "2")."""
        return (
            m > 0
            and bool(self.lines[m] == self.lines[m - 1])
            and int(self.stream_ids[m]) not in self.word_initial
            and int(self.stream_ids[m - 1]) not in self.blank
        )

    def word_start(self, m: int) -> int:
        """Stream index m moved back to the first token of its word (`WORD_START`)."""
        return int(self.word_starts[m]) if WORD_START else m

    def word_end(self, m: int) -> int:
        """The last token of the word that token m is in."""
        return int(self.word_ends[m])

    def place(self, f: FieldSlots, p_start: torch.Tensor, p_len: torch.Tensor) -> Placement | None:
        """Record where field f starts: its start distribution's argmax, moved back to its word's
        first token; the next item's same field starts after that word, and the item's first field
        is its anchor (line and word) for the others."""
        if len(p_start) == 0:
            return None
        if f.key in self.ended:
            return Placement(0, ended=True)
        m0 = int(p_start.argmax())
        m, end = self.word_start(m0), self.word_end(m0)
        self.previous[(f.group, f.field)] = end
        self.anchor.setdefault((f.group, f.item), (int(self.lines[m]), m, end + 1))
        return Placement(m, m0 - m, line_end(self.lines, m), float(p_start[m0]), p_len[m0])

    def write_span(
        self, toks: torch.Tensor, conf: torch.Tensor, i: int, k: int, place: Placement, gate, end_id: int
    ) -> bool:
        """Rewrite the field's k slots from i (in place) as one span of the document when the copy
        carries it and the slots gave a value: the slots' length (+ the tokens `back`), cut at the
        line's end, to the end of the word it stops in (as `snap`); a field with nothing left
        (`ended`) gets no value. True when it changed them."""
        if place.ended:
            toks[i : i + k] = end_id
            return True
        if not COPY_SPAN or int(toks[i]) == end_id:
            return False
        ends = (toks[i : i + k] == end_id).nonzero()
        n_slots = int(ends[0]) if len(ends) else k
        b = len(gate)  # the field's slots: fewer than k for a span field (`groups`, item_slots)
        if b < k and n_slots >= b and place.p_len is not None:  # the value fills its slots: its length
            n_slots = b + int(place.p_len[b - 1 :].argmax())  # is the copy head's likeliest from b on
        if float(gate[:n_slots].mean()) >= COPY_GATE:
            return False
        n = min(n_slots + place.back, k, place.line_end - place.start)
        n = min(int(self.word_ends[place.start + n - 1]) - place.start + 1, k)
        copied = self.stream_ids[place.start : place.start + n]
        put_copied(toks, conf, i, k, copied, place.p_start * float(place.p_len[n_slots - 1]), end_id)
        return True


def read_on(toks: torch.Tensor, conf: torch.Tensor, fields, end_id: int) -> None:
    """Groups that say "no more items" with probability below `STOP_P` (every other answer together
    is likelier: the model is unsure the list is over) are read as items, in place: each of their
    fields that said `<|pip_end|>` gets the word the copy head placed it on (`ItemPlacer.place`),
    with the probability of that start. `fields`: (i, k, place, gate, placer, f) of the list fields in
    template order (an item's first field first), as `decoding.pip.predict_slots` keeps them.
    Measured: docs/RESULTS.md "Lists that stop early"."""
    items: dict[tuple, list] = {}
    for i, k, place, _, placer, f in fields:
        items.setdefault((id(placer), f.group, f.item), []).append((i, k, place, placer))
    for group in items.values():
        i, _, place, _ = group[0]
        if int(toks[i]) != end_id or float(conf[i]) >= STOP_P or place.ended:
            continue
        for i, k, place, placer in group:
            if int(toks[i]) == end_id and not place.ended:
                n = min(int(placer.word_ends[place.start]) - place.start + 1, k)
                put_copied(toks, conf, i, k, placer.stream_ids[place.start : place.start + n], place.p_start, end_id)


def put_copied(toks: torch.Tensor, conf: torch.Tensor, i: int, k: int, copied, prob: float, end_id: int) -> None:
    """Write document tokens `copied` (at most k) into a field's k slots from i, `<|pip_end|>` after
    them, with the probability `prob` of the whole value spread over its tokens and its end token
    (so that the field's geometric-mean confidence, `results.field_result`, is `prob`^(1/(n+1)))."""
    n = min(len(copied), k)
    toks[i : i + k] = end_id
    toks[i : i + n] = copied[:n].to(toks.device)
    counted = min(n + 1, k)
    conf[i : i + counted] = max(prob, 1e-12) ** (1.0 / counted)
