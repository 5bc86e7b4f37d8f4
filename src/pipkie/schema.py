"""Key schemas: which fields to extract, from a list, "a,b,c", a pydantic model or a JSON schema.

A `Key` has a name (written literally into the template), an optional description (written into
the template too, `"total (the amount paid):"`, so a user can say what a terse or unusual key
means; pydantic's `Field(description=...)` and JSON schema's `description` become it) and an
optional budget: `max_tokens` (how many mask slots its value gets, the longest value it can produce)
or `max_chars` (the longest value in characters, JSON schema's `maxLength`; the model's tokenizer
turns it into slots, `TemplateBuilder.budget`, since characters per token depend on the tokenizer:
SmolLM2's writes one token per digit).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

MAX_KEYS = 64
MAX_KEY_CHARS = 64
MAX_VALUE_TOKENS = 256
MAX_VALUE_CHARS = 1024
MAX_DESCRIPTION_CHARS = 200
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\- ]*$")


class SchemaError(ValueError):
    """A key list that cannot be used (empty, duplicate, blank or over-long names…)."""


@dataclass(frozen=True)
class Key:
    name: str
    description: str | None = None
    max_tokens: int | None = None  # mask budget; None = from max_chars, else the model's default for this key
    max_chars: int | None = None  # longest value in characters (turned into slots by the tokenizer)

    def __post_init__(self):
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
            raise SchemaError(f"key {name!r}: description is {len(desc)} characters long (at most {MAX_DESCRIPTION_CHARS})")
        object.__setattr__(self, "description", desc or None)


@dataclass(frozen=True)
class KeySchema:
    keys: tuple[Key, ...]

    def __post_init__(self):
        if not self.keys:
            raise SchemaError("the key list is empty: give at least one key to extract")
        if len(self.keys) > MAX_KEYS:
            raise SchemaError(f"{len(self.keys)} keys given (at most {MAX_KEYS})")
        seen = set()
        for k in self.keys:
            if k.name in seen:
                raise SchemaError(f"key {k.name!r} is given twice")
            seen.add(k.name)

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.keys]

    def __iter__(self):
        return iter(self.keys)

    def __len__(self):
        return len(self.keys)

    @classmethod
    def parse(cls, spec: Any) -> "KeySchema":
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
            return cls.from_names(spec.split(","))
        if isinstance(spec, dict):
            return cls.from_json_schema(spec)
        if isinstance(spec, type) and hasattr(spec, "model_json_schema"):
            return cls.from_json_schema(spec.model_json_schema())
        if isinstance(spec, Iterable):
            return cls.from_names(list(spec))
        raise SchemaError(f"cannot read keys from a {type(spec).__name__}")

    @classmethod
    def from_names(cls, names: list) -> "KeySchema":
        keys = []
        for n in names:
            if isinstance(n, Key):
                keys.append(n)
            elif isinstance(n, str):
                keys.append(Key(n))
            else:
                raise SchemaError(f"a key must be a string, got {type(n).__name__}")
        return cls(tuple(keys))

    @classmethod
    def from_json_schema(cls, schema: dict) -> "KeySchema":
        """Flat object schema: every property a string (or nullable string). `maxLength` is kept as
        characters (`Key.max_chars`; the template builder turns it into slots with the model's
        tokenizer); `x-max-tokens` sets the slots directly."""
        props = schema.get("properties")
        if not isinstance(props, dict):
            raise SchemaError("a JSON schema needs an object with 'properties'")
        keys = []
        for name, p in props.items():
            types = _types(p)
            if not types <= {"string", "null"} or "string" not in types:
                raise SchemaError(f"field {name!r} must be a string (flat schemas only), got {sorted(types) or p}")
            budget, chars = p.get("x-max-tokens"), p.get("maxLength")
            for what, v in (("x-max-tokens", budget), ("maxLength", chars)):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                    raise SchemaError(f"field {name!r}: {what} must be an integer, got {v!r}")
            keys.append(Key(name, p.get("description"), budget, None if budget is not None else chars))
        return cls(tuple(keys))


def _types(prop: dict) -> set[str]:
    if "type" in prop:
        t = prop["type"]
        return set(t) if isinstance(t, list) else {t}
    options = prop.get("anyOf") or prop.get("oneOf") or []
    return {t for o in options for t in _types(o)}
