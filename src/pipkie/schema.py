"""Key schemas: which fields to extract, from a list, "a,b,c", a pydantic model or a JSON schema.

A `Key` has a name (written literally into the template), an optional description (written into
the template too, `"total (the amount paid):"`, so a user can say what a terse or unusual key
means; pydantic's `Field(description=...)` and JSON schema's `description` become it) and an
optional budget: `max_tokens` (how many mask slots its value gets, the longest value it can produce)
or `max_chars` (the longest value in characters, JSON schema's `maxLength`; the model's tokenizer
turns it into slots, `TemplateBuilder.budget`, since characters per token depend on the tokenizer:
SmolLM2's writes one token per digit).

A `Group` is a list of objects that share their fields (line items: `items: list[Item]`), decoded
in one pass like the flat keys (`pipkie.model.groups`). It comes from a JSON-schema array of objects
(`{"type": "array", "items": {"type": "object", "properties": …}, "maxItems": 30}`, pydantic's
`list[Item]` with `$ref`s resolved), from `Group` objects, or from the shorthand
`"company,total,items[name,quantity,price]"`. `max_items` (`maxItems`) is how many items the
template has room for (None: the template builder's default, `pipkie.model.groups.items_budget`). One
level only: an item's fields are strings.

A list may say which fields every item must have (`Group.required`: JSON schema's `required`,
pydantic's fields without a default, `items[name,price!]`): an item read without one of them is left
out of the list (`pipkie.model.groups.keep_complete`).

A key, flat or an item's field, may have a value type (`Key.type`: date, time, money, phone;
`"date:date"` or `"items[name,price:money]"` in the shorthand, JSON schema's `"format": "date"` or
`"x-type": "money"`): decoding then answers a value of that type or `unknown` (`pipkie.decoding.types`).
A key read from a name or a JSON schema without a type takes the one its name plainly says
(`implied_type`: `date`, `total`, `tel`, `due_date`, `items[...,price]`); `date:text` (`"x-type":
"text"`) keeps it untyped. A `Key` built in Python keeps exactly the type it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipkie.decoding.types import NO_TYPE, VALUE_TYPES, check_type, implied_type

MAX_KEYS = 64
MAX_KEY_CHARS = 64
MAX_VALUE_TOKENS = 256
MAX_VALUE_CHARS = 1024
MAX_DESCRIPTION_CHARS = 200
MAX_ITEMS = 128  # most items (groups) a list's template may have
KEY_FIRST, KEY_REST = r"[A-Za-z0-9_]", r"[A-Za-z0-9_.\- ]"  # a key name's first character, the others
_NAME = re.compile(rf"^{KEY_FIRST}{KEY_REST}*$")


class SchemaError(ValueError):
    """A key list that cannot be used (empty, duplicate, blank or over-long names…)."""


@dataclass(frozen=True)
class Key:
    name: str
    description: str | None = None
    max_tokens: int | None = None  # mask budget; None = from max_chars, else the model's default for this key
    max_chars: int | None = None  # longest value in characters (turned into slots by the tokenizer)
    type: str | None = None  # the kind of value (date, time, money, phone): a decoding constraint, `decoding.types`

    def __post_init__(self):
        if self.type is not None:
            try:
                check_type(self.type)
            except ValueError as e:
                raise SchemaError(f"key {self.name!r}: {e}") from None
        name = self.name.strip() if isinstance(self.name, str) else self.name
        if not isinstance(name, str) or not name:
            raise SchemaError("a key name is blank")
        if len(name) > MAX_KEY_CHARS:
            raise SchemaError(f"key {name[:20]!r}… is {len(name)} characters long (at most {MAX_KEY_CHARS})")
        if not _NAME.match(name) or ":" in name:
            raise SchemaError(f"key {name!r} has characters other than letters, digits, '_', '.', '-' and spaces")
        if self.max_tokens is not None and not (1 <= int(self.max_tokens) <= MAX_VALUE_TOKENS):
            raise SchemaError(f"key {name!r}: max_tokens must be between 1 and {MAX_VALUE_TOKENS}")
        if self.max_chars is not None and not (1 <= int(self.max_chars) <= MAX_VALUE_CHARS):
            raise SchemaError(f"key {name!r}: maxLength must be between 1 and {MAX_VALUE_CHARS} characters")
        object.__setattr__(self, "name", name)
        desc = " ".join(str(self.description).split()) if self.description is not None else ""
        if len(desc) > MAX_DESCRIPTION_CHARS:
            raise SchemaError(
                f"key {name!r}: description is {len(desc)} characters long (at most {MAX_DESCRIPTION_CHARS})"
            )
        object.__setattr__(self, "description", desc or None)


@dataclass(frozen=True)
class Group:
    """A list of objects with the same fields (line items), e.g. items[name, quantity, price]."""

    name: str
    fields: tuple[Key, ...]
    max_items: int | None = None  # items the template has room for; None: the builder's default
    # fields every item must have: an item read without one of them is not an item of this list and
    # is left out (JSON schema's `required` of the item object, pydantic's fields without a default,
    # `price!` in the shorthand). A header or total line taken for an item has no price of its own.
    required: tuple[str, ...] = ()

    def __post_init__(self):
        name = Key(self.name).name  # the same rules as a key's name
        object.__setattr__(self, "name", name)
        fields = tuple(self.fields)
        if not fields:
            raise SchemaError(f"list {name!r} has no fields: give them as {name}[name,price]")
        if not all(isinstance(f, Key) for f in fields):
            raise SchemaError(f"list {name!r}: its fields must be keys")
        names = [f.name for f in fields]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice:
            raise SchemaError(f"list {name!r}: field {twice!r} is given twice")
        object.__setattr__(self, "fields", fields)
        required = tuple(self.required)
        unknown = next((r for r in required if r not in names), None)
        if unknown is not None:
            raise SchemaError(f"list {name!r}: required field {unknown!r} is not one of its fields {names}")
        object.__setattr__(self, "required", required)
        m = self.max_items
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_ITEMS):
            raise SchemaError(f"list {name!r}: maxItems must be an integer between 1 and {MAX_ITEMS}, got {m!r}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def spec(self, required: bool = True) -> str:
        """The list in the keys shorthand, by field names: `items[name,quantity,price!]` (`!` marks a
        required field, left out with `required=False`)."""
        return f"{self.name}[{','.join(n + '!' * (required and n in self.required) for n in self.names)}]"


@dataclass(frozen=True)
class KeySchema:
    """Flat keys (`keys`, what iterating the schema yields) and lists of objects (`groups`)."""

    keys: tuple[Key, ...]
    groups: tuple[Group, ...] = ()

    def __post_init__(self):
        if not self.keys and not self.groups:
            raise SchemaError("the key list is empty: give at least one key to extract")
        if len(self) > MAX_KEYS:
            raise SchemaError(f"{len(self)} keys given (at most {MAX_KEYS})")
        seen = set()
        for k in (*self.keys, *self.groups):
            if k.name in seen:
                raise SchemaError(f"key {k.name!r} is given twice")
            seen.add(k.name)

    @property
    def names(self) -> list[str]:
        """The flat keys' names."""
        return [k.name for k in self.keys]

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    def __iter__(self):
        return iter(self.keys)

    def __len__(self):
        """Flat keys plus the fields of every list (what a key limit counts)."""
        return len(self.keys) + sum(len(g.fields) for g in self.groups)

    @classmethod
    def resolve(cls, keys: Any = None, schema: Any = None, default: Any = None) -> KeySchema:
        """The one answer to "which keys?": `schema` or `keys` (never both; anything `parse` reads),
        else `default` (a model's own keys, or a callable giving them; called only when needed).
        SchemaError when both are given or there is nothing to use."""
        if keys is not None and schema is not None:
            raise SchemaError("give keys or a schema, not both")
        spec = schema if schema is not None else keys
        if spec is None:
            spec = default() if callable(default) else default
            if not spec:
                raise SchemaError("no keys given and the model has no default keys: give keys or a schema")
        return cls.parse(spec)

    @classmethod
    def parse(cls, spec: Any) -> KeySchema:
        """Build a schema from a KeySchema, a list of names/Keys, "a,b,c", a pydantic model class,
        a JSON-schema dict, or a path to a JSON-schema file."""
        if isinstance(spec, KeySchema):
            return spec
        if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith(".json") and Path(spec).exists()):
            try:
                return cls.from_json_schema(json.loads(Path(spec).read_text()))
            except json.JSONDecodeError as e:
                raise SchemaError(f"{spec}: not JSON ({e.msg})") from e
        if isinstance(spec, str):
            return cls.from_names(split_keys(spec))
        if isinstance(spec, dict):
            return cls.from_json_schema(spec)
        if isinstance(spec, type) and hasattr(spec, "model_json_schema"):
            return cls.from_json_schema(spec.model_json_schema())
        if isinstance(spec, Iterable):
            return cls.from_names(list(spec))
        raise SchemaError(f"cannot read keys from a {type(spec).__name__}")

    @classmethod
    def from_names(cls, names: list) -> KeySchema:
        """Keys and Groups, or names: "total", or a list "items[name,price]"."""
        keys, groups = [], []
        for n in names:
            if isinstance(n, Key):
                keys.append(n)
            elif isinstance(n, Group):
                groups.append(n)
            elif isinstance(n, str) and ("[" in n or "]" in n):
                groups.append(parse_group(n))
            elif isinstance(n, str):
                keys.append(named_key(n))
            else:
                raise SchemaError(f"a key must be a string, got {type(n).__name__}")
        return cls(tuple(keys), tuple(groups))

    @classmethod
    def from_json_schema(cls, schema: dict) -> KeySchema:
        """Object schema: every property a string (or nullable string), or an array of objects whose
        properties are strings (a `Group`; `maxItems` its item budget; `$ref`s into `$defs` are
        followed, as pydantic writes `list[Item]`). `maxLength` is kept as characters
        (`Key.max_chars`; the template builder turns it into slots with the model's tokenizer);
        `x-max-tokens` sets the slots directly; `x-type` (or a `format` such as "date") the value type."""
        keys, groups = [], []
        for name, p in _properties(schema, schema, "a JSON schema").items():
            array = _array_items(p, schema)
            if array is None:
                keys.append(_string_key(name, p, schema))
                continue
            items, max_items = array
            fields = [
                _string_key(f, fp, schema, inside=name)
                for f, fp in _properties(items, schema, f"list {name!r}").items()
            ]
            if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int)):
                raise SchemaError(f"list {name!r}: maxItems must be an integer, got {max_items!r}")
            required = items.get("required") or ()  # `_array_items` resolved the item schema
            if not isinstance(required, list | tuple) or not all(isinstance(r, str) for r in required):
                raise SchemaError(f"list {name!r}: 'required' must be a list of field names, got {required!r}")
            groups.append(Group(name, tuple(fields), max_items, tuple(required)))
        return cls(tuple(keys), tuple(groups))


def _types(prop: dict) -> set[str]:
    if "type" in prop:
        t = prop["type"]
        return set(t) if isinstance(t, list) else {t}
    options = prop.get("anyOf") or prop.get("oneOf") or []
    return {t for o in options if isinstance(o, dict) for t in _types(o)}


def _resolve(prop, root: dict, depth: int = 0):
    """`prop` with a local `$ref` ("#/$defs/Item", "#/definitions/Item") replaced by its target."""
    while isinstance(prop, dict) and isinstance(prop.get("$ref"), str):
        ref = prop["$ref"]
        parts = ref.removeprefix("#/").split("/") if ref.startswith("#/") else None
        target = root
        for part in parts or [None]:
            target = target.get(part) if isinstance(target, dict) and part is not None else None
        if not isinstance(target, dict) or depth > 8:
            raise SchemaError(f"cannot follow $ref {ref!r} (only local references into $defs are read)")
        prop, depth = target, depth + 1
    return prop


def _properties(schema, root: dict, what: str) -> dict:
    schema = _resolve(schema, root)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        raise SchemaError(f"{what} needs an object with 'properties'")
    bad = next((n for n, p in props.items() if not isinstance(p, dict)), None)
    if bad is not None:
        raise SchemaError(f'{what}: property {str(bad)[:64]!r} must be an object (e.g. {{"type": "string"}})')
    return props


def _array_items(prop: dict, root: dict) -> tuple[dict, int | None] | None:
    """(item schema, maxItems) when the property is an array (or a nullable one), else None."""
    options = [prop] + [o for o in (prop.get("anyOf") or prop.get("oneOf") or []) if isinstance(o, dict)]
    for o in (_resolve(o, root) for o in options):
        types = o.get("type")
        if types == "array" or (isinstance(types, list) and "array" in types):
            items = o.get("items")
            if not isinstance(items, dict):
                raise SchemaError("an array property needs 'items': an object with 'properties'")
            return _resolve(items, root), o.get("maxItems", prop.get("maxItems"))
    return None


def _string_key(name: str, p: dict, root: dict, inside: str | None = None) -> Key:
    p = _resolve(p, root)
    types = _types(p)
    where = f"list {inside!r}: field {name!r}" if inside else f"field {name!r}"
    if not types <= {"string", "null"} or "string" not in types:
        shape = (
            "an item's fields are strings: one level of lists"
            if inside
            else "or an array of objects with string fields"
        )
        raise SchemaError(f"{where} must be a string ({shape}), got {sorted(map(str, types)) or p}")
    budget, chars = p.get("x-max-tokens"), p.get("maxLength")
    for what, v in (("x-max-tokens", budget), ("maxLength", chars)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SchemaError(f"{where}: {what} must be an integer, got {v!r}")
    # a value type: `x-type` (ours: an unknown one is an error), or a `format` that is one (others,
    # such as "email" or "date-time", are not checked, as JSON schema leaves unknown formats to the
    # reader, nor overridden by the key's name); else the one the name implies
    fmt = p.get("format")
    kind = p["x-type"] if "x-type" in p else (fmt if fmt in VALUE_TYPES or fmt is None else NO_TYPE)
    kind = _key_type(name, kind)
    return Key(name, p.get("description"), budget, None if budget is not None else chars, kind)


_GROUP = re.compile(r"^\s*([^\[\]]+?)\s*\[([^\[\]]*)\]\s*$")


def split_keys(spec: str) -> list[str]:
    """ "a, b, items[name,price]" -> ["a", "b", "items[name,price]"]: commas inside brackets do not split."""
    parts, depth, cur = [], 0, ""
    for c in spec:
        depth += (c == "[") - (c == "]")
        if depth < 0:
            raise SchemaError(f"{spec[:80]!r}: a ']' closes no '['")
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if depth:
        raise SchemaError(f"{spec[:80]!r}: a '[' is not closed (write a list as items[name,price])")
    return parts + [cur]


def parse_group(spec: str) -> Group:
    """ "items[name, quantity, price]" -> Group("items", (name, quantity, price)); a field written
    with a `!` after it (`price!`, `price:money!`) is one every item must have (`Group.required`)."""
    m = _GROUP.match(spec)
    if not m:
        raise SchemaError(f"{spec[:80]!r} is not a list of fields: write it as items[name,price] (one level)")
    fields = [f.strip() for f in m.group(2).split(",")]
    if not any(fields):
        raise SchemaError(f"list {m.group(1)!r} has no fields: give them as {m.group(1)}[name,price]")
    keys = [(named_key(f.rstrip("!")), f.endswith("!")) for f in fields]
    return Group(m.group(1), tuple(k for k, _ in keys), required=tuple(k.name for k, needed in keys if needed))


def named_key(spec: str) -> Key:
    """ "date:date" -> a typed key (`Key.type`), flat or an item's field; "total" -> typed as its
    name says (`implied_type`: money), "company" -> untyped; "date:text" -> untyped, whatever its name."""
    name, colon, kind = spec.rpartition(":") if ":" in spec else (spec, "", "")
    return Key(name, type=_key_type(name, kind.strip() if colon else None))


def _key_type(name: str, given: str | None) -> str | None:
    """The type a key is given (`text`: none), else the one its name implies."""
    if given is None:
        return implied_type(name)
    return None if given == NO_TYPE else given
