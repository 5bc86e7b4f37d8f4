"""Lists of objects (line items) in one pass: the group template, for PIP and the AR baseline.

A `Group` of the schema (`pipkie.schema`, e.g. `items[name, quantity, price]`) becomes K *group
blocks* after the flat fields, one per item, K = `items_budget` (the schema's `maxItems`, else
`DEFAULT_ITEMS` or fewer, as many as fit in `ITEMS_SHARE` of the context; at decoding, at most the
document's lines + 1: `within_lines`). Group i (from 0) holds
every field of item i, each with its own header that names the item's number (from 1) and the
field, then the field's slots:

    … flat fields …  "\\nitems 1 name:" ▢▢▢▢  "\\nitems 1 price:" ▢▢▢  "\\nitems 2 name:" ▢▢▢▢ …

or, for a model trained with `item_headers="first"`, the item's number said once (9 fewer tokens
per item of `items[name,quantity,price]`, whose slots a model may also set: `item_budgets`):

    … flat fields …  "\\nitems 1 name:" ▢▢▢▢  " price:" ▢▢▢  "\\nitems 2 name:" ▢▢▢▢ …

- Targets: the items in document (line) order, item i in group i; an empty column answers
  `unknown` as an absent flat key does. A group past the last item says "no more items": every slot
  of every field answers `<|pip_end|>`, so its first field's first slot is `<|pip_end|>`, which no
  real value starts with; decoding keeps the groups before the first such one (`collect`). More
  items than K: the first K are the targets (the list is cut; `ItemsResult.truncated`).
- Attention (`pipkie.model.attention.previous_group`): a group block is bidirectional within itself, sees
  the document and the previous group block, and nothing else (not the flat fields, not later
  groups). Seeing group i − 1 is how group i knows which line the list has reached, so that two
  groups do not take the same line; through the layers, information flows further down the chain.
  Group blocks have block ids from `GROUP_BLOCK` + 1 on (one per group, consecutive); a block id
  one below a group's is its previous group. Templates packed after one document in training leave
  one id unused between their runs of groups, so no template's first group sees another's last.
- Copy head: every field of every group is one more field with slots (`FieldSlots` with `group`,
  `item` and `field` set), pointing into the document like a flat field. Decoding keeps the items
  in the document's order (`MONOTONE_ITEMS`): the start of item i's field is searched only past
  where item i − 1's same field starts (a constraint on the copy head's start distribution, in
  the same single pass), so two items cannot take the same line.
- Span fields (`item_slots` = n > 0, a model setting): a list field gets at most n slots, and its
  value is read as ONE span of the document, as long as its budget: the copy head's first slot
  already says where the value starts and how long it is (`copyhead`, p(L | start) for every L up to
  the budget, not only up to the slots), and a list's values are copied from its lines
  (`decoding.items`). An item then costs its headers and 3n slots instead of ~24 (K items fit where
  a third as many did, and the pass over a 20-line receipt is shorter by a third to a half). The
  slots still carry "no more items" and an empty column (slot 0 says `<|pip_end|>` / `unknown`) and
  a value the document does not spell (the LM head), n tokens long at most. Training adds the
  span's likelihood, Σ_m p_start(m) p(L | m) [the document's L tokens from m are the value]
  (`copyhead.span_nll`), for values longer than the slots.
- AR (the baseline writes the list in the same layout): after the flat answers, item i's fields as
  `"\\nitems i name:" value <|pip_end|>`, …, and after the last item, the first header of the next
  item closed at once by `<|pip_end|>` (the "no more items" signal; none when all K items are
  written). Forced decoding writes the headers and stops a list when a first field is closed at
  once; free decoding parses the headers the model writes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from pipkie.model.attention import GROUP_BLOCK  # block ids above it are group blocks
from pipkie.schema import Group, Key, KeySchema

DEFAULT_ITEMS = 24  # items of a list without maxItems, when they fit
MONOTONE_ITEMS = True  # decoding: item i's fields start past item i - 1's (see the module docstring)
ITEMS_SHARE = 0.5  # a list without maxItems gets at most this share of the context
# slots of an item's field without a budget of its own (by name; else the builder's default)
ITEM_BUDGETS = {
    "name": 16,
    "description": 24,
    "product": 16,
    "item": 16,
    "quantity": 6,
    "qty": 6,
    "unit_price": 10,
    "unit price": 10,
    "price": 10,
    "amount": 10,
    "total": 10,
}


def header_text(group: Group, i: int, key: Key, description: bool = True, first_only: bool = False) -> str:
    """The header before field `key` of item i (from 0): "\\nitems 3 name:" (+ " (description)");
    with `first_only` (a builder's `item_headers="first"`) a field after the item's first is headed by
    its name alone (" price:"): the item's number is said once."""
    desc = f" ({key.description})" if description and key.description else ""
    if first_only and key.name != group.fields[0].name:
        return f" {key.name}{desc}:"
    return f"\n{group.name} {i + 1} {key.name}{desc}:"


def item_header(builder, group: Group, i: int, key: Key, description: bool = True) -> list[int]:
    """Token ids of `header_text` under the builder's `item_headers`."""
    return builder.cached_ids(header_text(group, i, key, description, builder.item_headers == "first"))


def field_budget(builder, group: Group, key: Key) -> int:
    """Slots of an item field: its max_tokens / max_chars, else the model's budget for
    "group.field", else its `item_budgets` by field name, else `ITEM_BUDGETS`, else the builder's
    default."""
    if key.max_tokens:
        return key.max_tokens
    if key.max_chars:
        return builder.chars_budget(key.max_chars)
    by_name = builder.item_budgets.get(key.name, ITEM_BUDGETS.get(key.name, builder.default_budget))
    return builder.budgets.get(f"{group.name}.{key.name}", by_name)


def span_slots(budget: int, item_slots: int) -> int:
    """Slots of a list field of `budget` tokens: the budget, or at most `item_slots` (a span field)."""
    return min(budget, item_slots) if item_slots else budget


def field_slots(builder, group: Group, key: Key) -> int:
    """Slots of an item field in the PIP template (`span_slots` of its budget)."""
    return span_slots(field_budget(builder, group, key), builder.item_slots)


def item_length(builder, group: Group, i: int) -> int:
    """Template tokens of item i of a list (its fields' headers and slots)."""
    return sum(len(item_header(builder, group, i, k)) + field_slots(builder, group, k) for k in group.fields)


def items_budgets(builder, schema: KeySchema) -> list[int]:
    """K per group: its max_items, else `DEFAULT_ITEMS`, fewer when the template would take more than
    `ITEMS_SHARE` of the context (at least 1)."""
    cache = builder.__dict__.setdefault("_items_budgets", {})
    ck = (schema, builder.max_length)
    if ck not in cache:
        room = int(builder.max_length * ITEMS_SHARE) - sum(len(builder.header(k)) + builder.budget(k) for k in schema)
        out = []
        for g in schema.groups:
            k = g.max_items
            if k is None:
                k = 0
                while k < DEFAULT_ITEMS and item_length(builder, g, k) <= room:
                    room -= item_length(builder, g, k)
                    k += 1
                k = max(1, k)
            else:
                room -= sum(item_length(builder, g, i) for i in range(k))
            out.append(k)
        cache[ck] = out
    return cache[ck]


def within_lines(builder, schema: KeySchema, text: str) -> KeySchema:
    """`schema` with each list's K cut to the document's number of lines + 1: a list's items are
    lines of the document, so a receipt of 6 lines never needs 24 groups, and the pass pays for the
    groups it can use (the one over is the "no more items" group, so a list that fills its K groups
    still means K was too small). Applied to every decoder by `Decoder.__call__`; the schema as given
    when nothing changes."""
    if not schema.groups:
        return schema
    n = text.count("\n") + 2
    ks = items_budgets(builder, schema)
    if all(k <= n for k in ks):
        return schema
    groups = tuple(replace(g, max_items=min(k, n)) for g, k in zip(schema.groups, ks))
    return replace(schema, groups=groups)


def template_length(builder, schema: KeySchema) -> int:
    """Tokens of the groups' part of the PIP template."""
    return sum(
        item_length(builder, g, i) for g, k in zip(schema.groups, items_budgets(builder, schema)) for i in range(k)
    )


def item_values(values, group: Group) -> list[dict]:
    """The items given for a group (a list of {field: value}); a missing or empty entry: none."""
    items = (values or {}).get(group.name) or []
    if not isinstance(items, list) or not all(isinstance(it, dict) for it in items):
        raise ValueError(f"the values of list {group.name!r} must be a list of objects")
    return items


def pip_groups(builder, schema: KeySchema, values=None, offset: int = 0):
    """The groups' part of the PIP template, to follow `offset` tokens: ids, FieldSlots, targets,
    block ids (`GROUP_BLOCK` + 1 + group number across the schema's lists)."""
    from pipkie.model.template import IGNORE, FieldSlots

    ids, targets, blocks, slots = [], [], [], []
    block = GROUP_BLOCK
    for g, k in zip(schema.groups, items_budgets(builder, schema)):
        items = item_values(values, g) if values is not None else []
        for i in range(k):
            block += 1
            for key in g.fields:
                h, budget = item_header(builder, g, i, key), field_budget(builder, g, key)
                b = field_slots(builder, g, key)
                v = None
                if values is not None:
                    v = builder.value_ids(items[i].get(key.name), budget) if i < len(items) else []
                    targets += [IGNORE] * len(h) + v[:b] + [builder.end_id] * (b - len(v[:b]))
                slots.append(
                    FieldSlots(
                        f"{g.name}[{i}].{key.name}",
                        offset + len(ids) + len(h),
                        b,
                        type=key.type,
                        group=g.name,
                        item=i,
                        field=key.name,
                        span=budget if b < budget else 0,
                        value=v if b < budget else None,
                    )
                )
                ids += h + [builder.slot_input(j) for j in range(b)]
                blocks += [block] * (len(h) + b)
        block += 1  # the next list's first group does not see this one's last
    return ids, slots, targets, blocks


# ---- AR ---------------------------------------------------------------------------------------
def key_list_text(schema: KeySchema) -> str:
    """The groups in the AR prompt's key list: ", items[name, quantity, price]"."""
    return "".join(f", {g.name}[{', '.join(k.name for k in g.fields)}]" for g in schema.groups)


def ar_reserved(builder, schema: KeySchema) -> int:
    """AR answer tokens of the groups: every item's headers, values and end tokens, plus the
    "no more items" header and end."""
    n = 0
    for g, k in zip(schema.groups, items_budgets(builder, schema)):
        n += sum(
            len(item_header(builder, g, i, f, False)) + field_budget(builder, g, f) + 1
            for i in range(k)
            for f in g.fields
        )
        n += len(item_header(builder, g, k, g.fields[0], False)) + 1
    return n


def ar_answer(builder, schema: KeySchema, values) -> list[int]:
    """The groups' part of the AR answer (see the module docstring)."""
    ids = []
    for g, k in zip(schema.groups, items_budgets(builder, schema)):
        items = item_values(values, g)[:k]
        for i, it in enumerate(items):
            for f in g.fields:
                ids += (
                    item_header(builder, g, i, f, False)
                    + builder.value_ids(it.get(f.name), field_budget(builder, g, f))
                    + [builder.end_id]
                )
        if len(items) < k:
            ids += item_header(builder, g, len(items), g.fields[0], False) + [builder.end_id]
    return ids


@dataclass
class Step:
    """One value a forced AR decoder asks for: its header, budget, and the list item it belongs to."""

    key: str
    header: list[int]
    budget: int
    group: str | None = None
    item: int = -1
    field: str | None = None
    first: bool = False  # the first field of an item: closed at once, the list has no more items


def ar_steps(builder, schema: KeySchema) -> list[Step]:
    """The flat keys' steps, then every item field's, in answer order."""
    steps = [Step(k.name, builder.answer_header(k), builder.budget(k)) for k in schema]
    for g, k in zip(schema.groups, items_budgets(builder, schema)):
        for i in range(k):
            for j, f in enumerate(g.fields):
                steps.append(
                    Step(
                        f"{g.name}[{i}].{f.name}",
                        item_header(builder, g, i, f, False),
                        field_budget(builder, g, f),
                        g.name,
                        i,
                        f.name,
                        first=j == 0,
                    )
                )
    return steps


# ---- results ----------------------------------------------------------------------------------
@dataclass
class ItemsResult:
    """A decoded list: its items (field -> FieldResult each), in document order. `confidence`: the
    geometric mean of the items' field confidences and of the "no more items" decision; `truncated`:
    no group said "no more items" (every group was used: the list may go on)."""

    items: list[dict] = field(default_factory=list)
    confidence: float = 0.0
    truncated: bool = False
    tokens: list[int] = field(default_factory=list)

    @property
    def value(self) -> list[dict]:
        return [{k: f.value for k, f in it.items()} for it in self.items]


def _geo(ps: list[float]) -> float:
    return math.exp(sum(math.log(max(p, 1e-12)) for p in ps) / len(ps)) if ps else 0.0


def collect(group: Group, entries, empty) -> ItemsResult:
    """entries: (item, field, FieldResult, stop) in template order, `stop` when the field is an item's
    first and said "no more items". The items before the first stop; fields never decoded get
    `empty()`; an item none of whose fields was read is left out."""
    by_item: dict[int, dict] = {}
    stop_conf, stopped = [], False
    for item, name, result, stop in entries:
        if stop:
            stop_conf.append(result.confidence)
            stopped = True
            break
        by_item.setdefault(item, {})[name] = result
    items = [{f: by_item[i].get(f) or empty() for f in group.names} for i in sorted(by_item)]
    items = [it for it in items if any(r.value is not None for r in it.values())]  # nothing read: no item
    confs = [r.confidence for it in items for r in it.values()] + stop_conf
    return ItemsResult(items, _geo(confs), truncated=not stopped)


def keep_complete(pred: dict, schema: KeySchema) -> dict:
    """One document's results with every list's items that lack a required field left out
    (`Group.required`): an item whose required field is `unknown` after typing (a `TOTAL` line taken
    for an item, whose amount is on another line) is not an item of that list. Every decoder alike
    (`Decoder.__call__`); the list's confidence is left as decoded."""
    out = dict(pred)
    for g in schema.groups:
        lst = out.get(g.name)
        if g.required and lst is not None:
            items = [it for it in lst.items if all(it[f].value is not None for f in g.required if f in it)]
            out[g.name] = replace(lst, items=items)
    return out


_FREE = re.compile(r"^(.+) (\d+) (.+)$")


def parse_free_item(schema: KeySchema, key: str):
    """(group, item from 0, field) of an AR free answer's header "items 3 name", else None."""
    m = _FREE.match(key)
    if not m:
        return None
    g = next((g for g in schema.groups if g.name == m.group(1)), None)
    if g is None or m.group(3) not in g.names or int(m.group(2)) < 1:
        return None
    return g, int(m.group(2)) - 1, m.group(3)
