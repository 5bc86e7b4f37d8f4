"""What `TemplateBuilder` (pipkie.model.template) produces: a model input with its field slots.

Kept apart from the builder so that decoders, trainers and tests can name these types without the
tokenizer logic; `pipkie.model.template` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DocumentTooLong(ValueError):
    """The document does not fit in the model's context next to the answer template."""


@dataclass
class FieldSlots:
    key: str  # a flat key's name; for a list's field "items[2].name" (pipkie.model.groups)
    start: int  # index in input_ids of the first value slot
    length: int  # number of slots (the key's budget)
    group: str | None = None  # the list (Group) a field of an item belongs to
    item: int = -1  # its item, from 0
    field: str | None = None  # its field's name
    type: str | None = None  # the key's value type, flat or an item's field (`Key.type`, `decoding.types`)
    # > 0: the value is one span of the document of up to this many tokens (its budget), read by the
    # copy head whatever the number of slots (a list field under `item_slots`: `pipkie.model.groups`)
    span: int = 0
    value: list[int] | None = None  # training a span field: its value's tokens, for the span's loss

    @property
    def width(self) -> int:
        """Tokens of the field's decoded answer: its slots, or its span's budget when longer."""
        return max(self.length, self.span)

    @property
    def may_be_absent(self) -> bool:
        """A flat key may answer `unknown` (the copy head's absent score); a list's field may not:
        a list says "no more items" instead (`pipkie.model.groups`). Training and decoding both ask here."""
        return self.group is None


@dataclass
class Encoded:
    input_ids: list[int]
    prefix_len: int  # instruction + document + <|pip_answer|>: the causal part
    fields: list[FieldSlots] = field(default_factory=list)
    # targets[p] = token to predict from position p (IGNORE where there is no loss). PIP: the value
    # token at a mask slot; AR: the next token.
    targets: list[int] | None = None
    truncated: int = 0  # document tokens cut to fit
    blocks: list[int] | None = None  # block id of each template token (1, or 1 + field index)
    seam: tuple[int, int] | None = None  # [start, end) of the cut marker in input_ids (a cut document)
    kept: list[int] | None = None  # per document position: its index in document_ids(text), -1 = marker


@dataclass
class Fit:
    """A prefix that fits: instruction (+ image) + document, cut if needed (+ <|pip_answer|>)."""

    ids: list[int]
    cut: int  # document tokens dropped (0: the whole document is in)
    start: int  # first document position in ids
    kept: list[int]  # per document position (ids[start:start + len(kept)]): index in document_ids, -1 = marker
    seam: tuple[int, int] | None = None  # [start, end) of the marker in ids
