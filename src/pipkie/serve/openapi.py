"""What the OpenAPI document (/docs, /openapi.json) says about the endpoints: response models, the
two request bodies of POST /extract (multipart upload or JSON), POST /render's upload and PNG
answer, and every error answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from pipkie.decoding import DECODERS
from pipkie.decoding.types import NO_TYPE, VALUE_TYPES
from pipkie.schema import KEY_FIRST, KEY_REST, MAX_KEY_CHARS
from pipkie.serve.parsing import MAX_REFINE_STEPS


class BoxOut(BaseModel):
    page: int
    x0: float
    y0: float
    x1: float
    y1: float
    text: str


class FieldOut(BaseModel):
    value: str | None
    confidence: float
    boxes: list[BoxOut]
    grounding: str
    truncated: bool = False
    withheld: str | None = None  # the value read, answered unknown below the model's threshold for its key
    layout: bool = False  # a list item's field read off a line the decoder skipped, by its neighbours' layout


class ExtractionOut(BaseModel):
    document: str
    # a flat key's field, or a list's items (one {field: FieldOut} per item, in line order)
    fields: dict[str, FieldOut | list[dict[str, FieldOut]]]
    decode: str
    seconds: float
    truncated: bool
    dropped_tokens: int = 0
    lists_truncated: list[str] = []  # lists that used every item of their budget (maybe more lines)


class ErrorOut(BaseModel):
    code: str
    detail: str
    request_id: str


class HealthOut(BaseModel):
    status: str
    model: str
    keys: list[str]
    decodes: list[str]
    limits: dict[str, Any]
    batching: dict[str, Any]


# a key as the shorthand writes it (`pipkie.schema`): `total`, `date:date`, `note:text`, or a list
# `items[name,price:money!]`; a key written without a type takes the one its name implies
_NAME = rf"{KEY_FIRST}{KEY_REST}{{0,{MAX_KEY_CHARS - 1}}}"  # the schema's key names
_TYPE = rf"(?: *: *(?:{'|'.join([*VALUE_TYPES, NO_TYPE])}))?"
_FIELD = rf" *{_NAME}{_TYPE}!? *"
_ONE = rf" *(?:{_NAME}{_TYPE}|{_NAME}\[{_FIELD}(?:,{_FIELD})*\]) *"
_KEY = rf"^{_ONE}$"
_KEY_LIST = rf"^{_ONE}(?:,{_ONE})*$"
_WORD = {
    "type": "object",
    "required": ["text", "box"],
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string"},
        "box": {
            "type": "array",
            "items": {"type": "number", "minimum": 0, "maximum": 1000},
            "anyOf": [{"minItems": 4, "maxItems": 4}, {"minItems": 8, "maxItems": 8}],
            "description": "[x0, y0, x1, y1] or 8 corners; 0-1000, or pixels with page_sizes",
        },
        "page": {"type": "integer", "default": 0, "minimum": 0},
    },
}
_KEYS = {
    "description": 'keys to extract: a list or "a,b,c" (default: the model\'s keys; at most max_keys); '
    "`name:type` asks for a date, time, money or phone value (`text`: any), a key written without one "
    "takes the type its name implies (`date`, `total`, `tel`); `items[name,price:money!]` is a list",
    "anyOf": [
        {
            "type": "array",
            "items": {"type": "string", "pattern": _KEY},
            "minItems": 1,
            "maxItems": 64,
            "uniqueItems": True,
        },
        {"type": "string", "pattern": _KEY_LIST},
    ],
}
_SCHEMA = {
    "type": "object",
    "description": "a flat JSON schema (instead of keys): string properties",
    "required": ["properties"],
    "properties": {
        "properties": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["string"]},
                    "description": {"type": "string", "maxLength": 200},
                    "maxLength": {"type": "integer", "minimum": 1, "maximum": 1024},
                },
            },
        }
    },
}
_DECODE = {"type": "string", "enum": list(DECODERS), "default": "pip"}
_STEPS = {"type": "integer", "default": 0, "minimum": 0, "maximum": MAX_REFINE_STEPS}
REQUEST_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "not": {"required": ["keys", "schema"]},
                "properties": {
                    "file": {
                        "type": "string",
                        "format": "binary",
                        "description": "image (PNG, JPEG, TIFF…), PDF, JSON words, SROIE box file or text",
                    },
                    "keys": {**_KEYS["anyOf"][1], "description": "comma-separated keys, e.g. company,date,total"},
                    "schema": {"type": "string", "description": "a flat JSON schema (instead of keys), as a string"},
                    "decode": _DECODE,
                    "refine_steps": _STEPS,
                },
                "required": ["file"],
            }
        },
        "application/json": {
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "oneOf": [{"required": ["words"]}, {"required": ["text"]}],
                "not": {"required": ["keys", "schema"]},
                "properties": {
                    "words": {
                        "type": "array",
                        "items": _WORD,
                        "minItems": 1,
                        "description": "OCR words (give words or text; at most max_words)",
                    },
                    "page_sizes": {
                        "type": "array",
                        "items": {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 1},
                            "minItems": 2,
                            "maxItems": 2,
                        },
                        "description": "[[w, h], ...] pixels; without it boxes are 0-1000",
                    },
                    "normalized": {"type": "boolean", "default": False},
                    "text": {"type": "string", "pattern": r"\S", "description": "plain text (give words or text)"},
                    "keys": _KEYS,
                    "schema": _SCHEMA,
                    "decode": _DECODE,
                    "refine_steps": _STEPS,
                    "id": {"type": "string", "maxLength": 200},
                },
            },
            "example": {
                "words": [
                    {"text": "TOTAL", "box": [100, 800, 200, 820]},
                    {"text": "9.90", "box": [700, 800, 780, 820]},
                ],
                "keys": ["total"],
                "decode": "pip",
            },
        },
    },
}
TIMEOUT_PARAMETER = {
    "name": "X-Request-Timeout",
    "in": "header",
    "required": False,
    "schema": {"type": "number", "minimum": 1, "maximum": 300},
    "description": "this request's deadline in seconds (default, least and most: GET /health "
    "limits request_timeout_s, min_request_timeout_s, max_request_timeout_s)",
}
ERRORS = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "malformed body",
        413: "body, pages, pixels or words over the limit",
        415: "unsupported content or file type",
        422: "bad keys, schema, decode or document",
        500: "internal error (quote the request id)",
        503: "overloaded or shutting down (see Retry-After), or OCR unavailable",
        504: "no answer within the deadline",
    }.items()
}
METRICS_RESPONSE = {
    200: {"description": "Prometheus text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}
}
RENDER_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "required": ["file"],
                "properties": {
                    "file": {
                        "type": "string",
                        "format": "binary",
                        "description": "the document sent to POST /extract: image, PDF, JSON words or SROIE box file",
                    },
                    "page": {"type": "integer", "minimum": 0, "default": 0, "description": "the page, 0 the first"},
                },
            }
        }
    },
}
RENDER_RESPONSES = {
    200: {
        "description": "the page as the service read it, a PNG at most 1600 pixels on its longest side",
        "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "X-Page-Count": {
                "description": "how many pages the document has",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    },
    **{code: answer for code, answer in ERRORS.items() if code != 422},
    422: {"model": ErrorOut, "description": "bad page number, unreadable document, or plain text (no page image)"},
}
