"""PIP inputs and AR targets, built from one definition of the answer template.

Token layout (every piece tokenized on its own, so no BPE merge crosses a boundary):

    INSTRUCTION  document text  <|pip_answer|>  "\\n" key_1 ":"  v v v …  "\\n" key_2 ":"  v v …
    └──────────────── prefix (causal) ────────┘ └──────────────── template block ─────────────┘

- PIP (parallel):  each value `v v v …` is K = budget(key) `<|pip_mask|>` slots. The targets are the
  value's tokens (tokenized as " " + value) followed by `<|pip_end|>` in every surplus slot; an
  absent key's value is the literal `unknown`. All slots are predicted in one forward pass.
- AR (autoregressive): the prompt names the requested keys (`"\\nkeys: company, date"`, so a model
  writing freely knows what to write) before `<|pip_answer|>`; the answer has the same layout with
  the value tokens written out, each value closed by `<|pip_end|>`, the answer closed by the
  tokenizer's eos. *Free* decoding generates everything after `<|pip_answer|>`; *forced-template*
  decoding inserts the `"\\n" key ":"` headers itself and generates only value tokens up to
  `<|pip_end|>`.

Two options make the one-pass problem easier for small models (both saved with the model):
- `slot_tokens=n`: slot j holds `<|pip_slot_j|>` (j < n) instead of the shared `<|pip_mask|>`, so a slot
  knows its index without counting positions;
- `field_blocks=True`: each `"\n" key ":" slots` run is a block of its own under `prefix_causal`
  attention: a field's slots see the document and their own key only, so a field's answer never
  depends on which other keys were asked for.

A third option serves the copy head (`copy=True`, pipkie.model.copyhead): every document line is
tokenized with a leading space (`" " + line`), so a value's tokens (" " + value) appear verbatim in
the document's token stream, across line breaks too once the line-break tokens are skipped
(`copy_stream`).

A key with a description (`pipkie.schema.Key.description`) has the header `"\n" key " (" description
"):"` in PIP's template and in the AR prompt's key list; AR answers write the name alone.

Budgets: a key's `max_tokens`, else its `max_chars` turned into tokens by this tokenizer (enough
slots for that many digits, the worst case of SmolLM2's one-token-per-digit splitting, plus the end
token: `budget`), else the model's per-key budget, else the default. Values longer than a key's
budget are cut to the budget in both paradigms, so PIP and AR learn and produce the same answers.

A document that does not fit in `max_length` (with the template and, for AR, the value budgets) is
cut in its middle with a warning, or refused, by option; the template is never dropped. The cut
keeps the document's first and last tokens with a marker line (`"\n …\n"`, `CUT_MARKER`) between
them: receipts and invoices put totals at the end, contracts their parties and dates at the start,
and head + tail keeps both in ONE forward pass (windows merged by confidence would cost a pass per
window). Both parts are slices of the whole document's tokens, so every kept document position still
maps to one token of `document_ids(text)` (`Fit.kept`) and through its characters to OCR words; the
marker's positions (`Encoded.seam`) are left out of the copy stream.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from pipkie.model.encoded import DocumentTooLong, Encoded, FieldSlots, Fit
from pipkie.schema import MAX_VALUE_TOKENS, Key, KeySchema

MASK, END, ANSWER = "<|pip_mask|>", "<|pip_end|>", "<|pip_answer|>"
SPECIAL_TOKENS = (MASK, END, ANSWER)
UNKNOWN = "unknown"
INSTRUCTION = "Extract the key information from this document.\n"
IGNORE = -100
CUT_MARKER = "\n …\n"  # between the head and the tail of a document cut to fit
HEAD_SHARE = 0.5  # of the document tokens kept when cutting, the share taken from the start
# a list item's headers: "each" field its own "\nitems 3 price:" (models up to round 5); "first": only
# the first field names the item ("\nitems 3 name:" … " price:"), 9 fewer template tokens per item
ITEM_HEADERS = ("each", "first")


def header_text(key: Key | str) -> str:
    """The text before a field's value: "\nname:" or "\nname (description):"."""
    if isinstance(key, Key):
        return f"\n{key.name} ({key.description}):" if key.description else f"\n{key.name}:"
    return f"\n{key}:"


def slot_token(j: int) -> str:
    return f"<|pip_slot_{j}|>"


def add_special_tokens(tokenizer, slot_tokens: int = 0) -> None:
    """Add pipkie's special tokens (and an eos/pad if the tokenizer has none); idempotent."""
    from tokenizers import AddedToken

    wanted = list(SPECIAL_TOKENS) + [slot_token(j) for j in range(slot_tokens)]
    missing = [t for t in wanted if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    if tokenizer.eos_token is None:
        tokenizer.add_special_tokens({"eos_token": "<|endoftext|>"})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


class TemplateBuilder:
    """Turns (document text, keys, optional values) into model inputs for PIP or AR."""

    def __init__(
        self,
        tokenizer,
        *,
        max_length: int = 2048,
        budgets: Mapping[str, int] | None = None,
        default_budget: int = 16,
        on_overflow: str = "truncate",  # or "error"
        instruction: str = INSTRUCTION,
        slot_tokens: int = 0,
        field_blocks: bool = False,
        copy: bool = False,
        item_headers: str = "each",
        item_budgets: Mapping[str, int] | None = None,
        item_slots: int = 0,
    ):
        if on_overflow not in ("truncate", "error"):
            raise ValueError("on_overflow must be 'truncate' or 'error'")
        if item_headers not in ITEM_HEADERS:
            raise ValueError(f"item_headers must be one of {', '.join(ITEM_HEADERS)} (got {item_headers!r})")
        if isinstance(item_slots, bool) or not isinstance(item_slots, int) or item_slots < 0:
            raise ValueError(f"item_slots must be a whole number >= 0 (got {item_slots!r})")
        add_special_tokens(tokenizer, slot_tokens)
        self.tok = tokenizer
        self.field_blocks = field_blocks
        self.copy = copy
        self.item_headers = item_headers  # a list item's headers (pipkie.model.groups.header_text)
        self.item_budgets = dict(item_budgets or {})  # slots of a list's fields by name, over groups.ITEM_BUDGETS
        self.item_slots = item_slots  # > 0: a list field's slots, its value read as a span (groups.field_slots)
        self._newline_ids: set[int] | None = None
        self._space_ids: set[int] | None = None
        self._blank_ids: set[int] | None = None
        self.max_length = max_length
        self.budgets = dict(budgets or {})
        self.default_budget = default_budget
        self.on_overflow = on_overflow
        self.mask_id, self.end_id, self.answer_id = (tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.slot_ids = tokenizer.convert_tokens_to_ids([slot_token(j) for j in range(slot_tokens)])
        self.input_specials = {self.mask_id, *self.slot_ids}
        self.instruction_ids = self._ids(instruction)
        self._headers: dict[str, list[int]] = {}
        self._char_budgets: dict[int, int] = {}
        self.marker_ids = self._ids(CUT_MARKER)
        self.unknown_id = self._ids(" " + UNKNOWN)[0]  # an absent key's first value token (copy head)

    # -- pieces ------------------------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def header(self, key: Key | str) -> list[int]:
        """`"\n" name ":"`, or `"\n" name " (" description "):"` for a key with a description: PIP's
        header of a field (what its slots read to know what to find)."""
        return self.cached_ids(header_text(key))

    def cached_ids(self, text: str) -> list[int]:
        """The tokens of a template piece (a header), tokenized once."""
        if text not in self._headers:
            self._headers[text] = self._ids(text)
        return self._headers[text]

    def answer_header(self, key: Key | str) -> list[int]:
        """The header an AR answer writes before a value: the name only (its description, if any, is in
        the AR prompt's key list, so a free decoder need not repeat it)."""
        return self.header(key.name if isinstance(key, Key) else key)

    def budget(self, key: Key) -> int:
        """Slots of a key's value: `max_tokens`, else `max_chars` in this tokenizer's tokens, else the
        model's budget for the key, else the default."""
        if key.max_tokens:
            return key.max_tokens
        if key.max_chars:
            return self.chars_budget(key.max_chars)
        return self.budgets.get(key.name, self.default_budget)

    def chars_budget(self, n: int) -> int:
        """Slots for a value of up to n characters: the tokens of n digits after the leading space
        (" 9999…"; with one token per digit the longest n-character values), + 1 for the end token,
        so a value of exactly n characters still closes inside its budget."""
        if n not in self._char_budgets:
            self._char_budgets[n] = min(MAX_VALUE_TOKENS, len(self._ids(" " + "9" * n)) + 1)
        return self._char_budgets[n]

    def value_ids(self, value: str | None, budget: int) -> list[int]:
        return self._ids(" " + (value if value is not None and value.strip() else UNKNOWN))[:budget]

    def decode_value(self, ids: list[int]) -> str | None:
        """Value tokens → text; stops at the first end token; `unknown` or empty → None (missing)."""
        kept = []
        for i in ids:
            if i in (self.end_id, self.eos_id):
                break
            if i not in self.input_specials and i not in (self.answer_id, self.pad_id):
                kept.append(i)
        text = self.tok.decode(kept, skip_special_tokens=True).strip()
        return None if not text or text == UNKNOWN else text

    def key_list(self, schema: KeySchema) -> list[int]:
        """The AR prompt's list of requested keys (PIP's template names them already); lists as
        `items[name, price]`."""
        text = ", ".join(header_text(k)[1:-1] for k in schema)
        if schema.groups:
            from pipkie.model.groups import key_list_text

            text = (text + key_list_text(schema)).removeprefix(", ")
        return self._ids("\nkeys: " + text)

    def document_ids(self, text: str) -> list[int]:
        """The document's tokens. With `copy`, every line starts with a space, so a word at the
        start of a line is tokenized as it is inside a value (" BANDAR", not "BANDAR")."""
        if self.copy:
            text = " " + text.replace("\n", "\n ")
        return self._ids(text)

    def document_offsets(self, text: str) -> list[tuple[int, int]]:
        """(start, end) in `text` of each token of `document_ids(text)`, the spaces `copy` adds left
        out ((s, s) for a token made only of them): how a document position maps back to characters,
        and through them to OCR words."""
        src = text
        orig = list(range(len(text)))
        if self.copy:  # document_ids' " " + text.replace("\n", "\n ")
            src = " " + text.replace("\n", "\n ")
            orig = [-1]
            for i, c in enumerate(text):
                orig += [i, -1] if c == "\n" else [i]
        try:
            enc = self.tok(src, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, TypeError, ValueError) as e:
            raise RuntimeError(f"character offsets need a fast tokenizer ({e})") from e
        out, last = [], 0
        for s, e in enc["offset_mapping"]:
            chars = [orig[j] for j in range(s, min(e, len(orig))) if orig[j] >= 0]
            last = chars[-1] + 1 if chars else last
            out.append((chars[0], last) if chars else (last, last))
        return out

    @property
    def newline_ids(self) -> set[int]:
        """Tokens made of whitespace with a line break: left out of the copy stream."""
        if self._newline_ids is None:
            vocab = self.tok.get_vocab()
            self._newline_ids = {
                i for t, i in vocab.items() if "\n" in (s := self.tok.convert_tokens_to_string([t])) and not s.strip()
            }
        return self._newline_ids

    @property
    def space_ids(self) -> set[int]:
        """Tokens that begin with whitespace (a word's first token, or a bare space before one: SmolLM2
        writes " 12" as " ", "1", "2"), for `pipkie.decoding.items`."""
        if self._space_ids is None:
            vocab = self.tok.get_vocab()
            self._space_ids = {i for t, i in vocab.items() if self.tok.convert_tokens_to_string([t])[:1].isspace()}
        return self._space_ids

    @property
    def blank_ids(self) -> set[int]:
        """Tokens made of whitespace only (some of `space_ids`)."""
        if self._blank_ids is None:
            text = self.tok.convert_tokens_to_string
            self._blank_ids = {i for i in self.space_ids if not text([self.tok.convert_ids_to_tokens(i)]).strip()}
        return self._blank_ids

    def copy_stream(self, ids: list[int], start: int, end: int, seam: tuple[int, int] | None = None) -> list[int]:
        """Positions in `ids[start:end]` (the document) that a copy head may copy from: not line breaks,
        not the cut marker at `seam` (`Encoded.seam`)."""
        skip = self.newline_ids
        a, b = seam or (0, 0)
        return [p for p in range(start, end) if ids[p] not in skip and not a <= p < b]

    def document_span(self, prefix_len: int, image: list[int] | None = None) -> tuple[int, int]:
        """(start, end) of the document's tokens in a prefix of length prefix_len that ends with
        <|pip_answer|>."""
        return len(self.instruction_ids) + len(image or []), prefix_len - 1

    def document_room(self, reserved: int, answer: bool = True, image: list[int] | None = None) -> int:
        """Document tokens that fit next to `reserved` template tokens (the instruction, image tokens
        and <|pip_answer|> come off too)."""
        return self.max_length - reserved - len(self.instruction_ids) - len(image or []) - int(answer)

    def overflow(self, text: str, reserved: int, answer: bool = True) -> int:
        """Document tokens `prefix` drops to fit (0 when the document fits)."""
        return max(0, len(self.document_ids(text)) - self.document_room(reserved, answer))

    def fit(self, text: str, reserved: int, answer: bool = True, image: list[int] | None = None) -> Fit:
        """instruction (+ image tokens) + document (+ <|pip_answer|>) in `max_length - reserved` tokens.
        A document too long is cut in the middle: its first `HEAD_SHARE` and its last tokens are kept
        with `CUT_MARKER` between them (module docstring), with a warning (or DocumentTooLong)."""
        doc = self.document_ids(text)
        head = self.instruction_ids + list(image or [])
        room = self.document_room(reserved, answer, image)
        if room < 1:
            raise DocumentTooLong(
                f"the answer template needs {reserved} tokens; with max_length={self.max_length} no room is left "
                "for the document (fewer keys, smaller budgets or a smaller maxItems)"
            )
        cut = max(0, len(doc) - room)
        kept, seam = list(range(len(doc))), None
        if cut:
            msg = f"document has {len(doc)} tokens; only {room} fit next to the template (max_length={self.max_length})"
            if self.on_overflow == "error":
                raise DocumentTooLong(msg)
            marker = self.marker_ids if room - len(self.marker_ids) >= 2 else []
            n_head = int((room - len(marker)) * HEAD_SHARE) if marker else 0
            n_tail = room - len(marker) - n_head
            warnings.warn(
                msg + f": {cut} tokens are dropped from the middle (the first {n_head} and the last {n_tail} are kept)",
                stacklevel=3,
            )
            kept = list(range(n_head)) + [-1] * len(marker) + list(range(len(doc) - n_tail, len(doc)))
            if marker:
                seam = (len(head) + n_head, len(head) + n_head + len(marker))
            doc = doc[:n_head] + marker + doc[len(doc) - n_tail :]
        return Fit(head + doc + ([self.answer_id] if answer else []), cut, len(head), kept, seam)

    def prefix(
        self, text: str, reserved: int, answer: bool = True, image: list[int] | None = None
    ) -> tuple[list[int], int]:
        """`fit`'s ids and number of document tokens dropped. `image`: a vision-language model's
        image placeholder tokens."""
        f = self.fit(text, reserved, answer, image)
        return f.ids, f.cut

    # -- PIP -------------------------------------------------------------------------------
    def template_length(self, schema: KeySchema) -> int:
        n = sum(len(self.header(k)) + self.budget(k) for k in schema)
        if schema.groups:
            from pipkie.model.groups import template_length

            n += template_length(self, schema)
        return n

    def pip(
        self,
        text: str,
        schema: KeySchema,
        values: Mapping[str, str | None] | None = None,
        image: list[int] | None = None,
    ) -> Encoded:
        f = self.fit(text, self.template_length(schema), image=image)
        ids = f.ids
        enc = Encoded(ids, prefix_len=len(ids), truncated=f.cut, seam=f.seam, kept=f.kept)
        block_ids, enc.fields, targets, enc.blocks = self.pip_block(schema, values, offset=len(ids))
        enc.input_ids = ids + block_ids
        enc.targets = [IGNORE] * len(ids) + targets if values is not None else None
        return enc

    def slot_input(self, j: int) -> int:
        """The input token of value slot j: its own slot token, or the shared mask."""
        return self.slot_ids[min(j, len(self.slot_ids) - 1)] if self.slot_ids else self.mask_id

    def pip_block(self, schema: KeySchema, values=None, offset: int = 0):
        """The template alone, to follow a prefix of length `offset`: ids, slots, targets, block ids.
        A schema's lists (groups) follow its flat fields (pipkie.model.groups)."""
        ids, targets, blocks, slots = [], [], [], []
        for i, k in enumerate(schema):
            h, b = self.header(k), self.budget(k)
            slots.append(FieldSlots(k.name, offset + len(ids) + len(h), b, type=k.type))
            ids += h + [self.slot_input(j) for j in range(b)]
            blocks += [1 + i if self.field_blocks else 1] * (len(h) + b)
            if values is not None:
                v = self.value_ids(values.get(k.name), b)
                targets += [IGNORE] * len(h) + v + [self.end_id] * (b - len(v))
        if schema.groups:
            from pipkie.model.groups import pip_groups

            g_ids, g_slots, g_targets, g_blocks = pip_groups(self, schema, values, offset + len(ids))
            ids, slots, targets, blocks = ids + g_ids, slots + g_slots, targets + g_targets, blocks + g_blocks
        return ids, slots, targets, blocks

    # -- AR --------------------------------------------------------------------------------
    def ar_reserved(self, schema: KeySchema) -> int:
        """Tokens after the document: key list, <|pip_answer|>, headers + budgets + one end token per
        field, eos."""
        n = len(self.key_list(schema)) + 1 + sum(len(self.answer_header(k)) + self.budget(k) + 1 for k in schema) + 1
        if schema.groups:
            from pipkie.model.groups import ar_reserved

            n += ar_reserved(self, schema)
        return n

    def ar_answer(self, schema: KeySchema, values: Mapping[str, str | None]) -> list[int]:
        """The answer an AR model writes after <|pip_answer|> (its training target)."""
        ids = []
        for k in schema:
            ids += self.answer_header(k) + self.value_ids(values.get(k.name), self.budget(k)) + [self.end_id]
        if schema.groups:
            from pipkie.model.groups import ar_answer

            ids += ar_answer(self, schema, values)
        return ids + [self.eos_id]

    def ar_prompt(self, text: str, schema: KeySchema) -> Encoded:
        f = self.fit(text, self.ar_reserved(schema), answer=False)
        ids = f.ids + self.key_list(schema) + [self.answer_id]
        return Encoded(ids, prefix_len=len(ids), truncated=f.cut, seam=f.seam, kept=f.kept)

    def ar(self, text: str, schema: KeySchema, values: Mapping[str, str | None]) -> Encoded:
        """Teacher-forced AR training sequence; targets[p] = input_ids[p + 1] over the answer."""
        enc = self.ar_prompt(text, schema)
        ids = enc.input_ids + self.ar_answer(schema, values)
        start = enc.prefix_len - 1
        enc.input_ids = ids
        enc.targets = [IGNORE] * start + ids[start + 1 :] + [IGNORE]
        return enc
