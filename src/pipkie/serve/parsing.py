"""Request parsing for POST /extract: body (size-limited), form or JSON, keys, decode, deadline.

Everything here is the client's input, so every failure is an `ApiError` 4xx with a stable code
and a message about the request (never exception text). The result is an `ExtractRequest`: what
to load (a function the service runs in its loader pool, with a cancel event) and how to extract.
Nothing heavy runs here: documents are loaded (decoded, OCR'd) by the service, after admission.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException  # what Request.form() raises
from starlette.requests import ClientDisconnect

from pipkie.decoding import DECODERS
from pipkie.io.document import Document
from pipkie.io.loaders import DocumentError, LimitExceeded, load_document, sniff, words_document
from pipkie.schema import KeySchema, SchemaError, split_keys
from pipkie.serve.errors import ApiError
from pipkie.serve.settings import ServeSettings

MAX_REFINE_STEPS = 8
FORM_FIELDS = {"file", "text", "keys", "schema", "decode", "refine_steps"}
JSON_FIELDS = {"words", "page_sizes", "normalized", "text", "keys", "schema", "decode", "refine_steps", "id"}
UPLOAD_TYPES = ("image/", "application/pdf", "application/json", "text/plain", "text/csv", "application/octet-stream")
TIMEOUT_HEADER = "x-request-timeout"
ENVELOPE_BYTES = 256 * 1024  # multipart boundaries and form fields, on top of the upload itself
THREAD_PARSE_BYTES = 256 * 1024  # JSON bodies above this are parsed off the event loop
MAX_SCHEMA_DEPTH = 8


@dataclass
class ExtractRequest:
    """A parsed request: `load(cancel)` builds its Document; `kind` says what loading costs
    ("ocr": an image or PDF, "parse": words or text)."""

    name: str
    kind: str
    load: Callable[[threading.Event], Document]
    schema: KeySchema
    decode: str
    refine_steps: int


def invalid(detail: str, code: str = "invalid_request") -> ApiError:
    return ApiError(422, code, detail)


def request_timeout(request: Request, settings: ServeSettings) -> float:
    """The request's deadline in seconds: X-Request-Timeout if given (between min_request_timeout_s
    and max_request_timeout_s), else request_timeout_s."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return settings.request_timeout_s
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    low, high = settings.min_request_timeout_s, settings.max_request_timeout_s
    if not low <= value <= high:  # NaN fails too
        raise invalid(f"X-Request-Timeout must be a number of seconds from {low:g} to {high:g}")
    return value


async def read_body(request: Request, limit: int, limit_mb: float) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes."""
    too_large = ApiError(413, "body_too_large", f"request body too large: the limit is {limit_mb:g} MB")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(499, "client_closed_request", "the client closed the connection") from None
    return b"".join(chunks)


def replay(body: bytes):
    """An ASGI `receive` that delivers `body` in one message, then reports a disconnect."""
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _check_schema_shape(schema: Any, depth: int = 0) -> None:
    """What KeySchema.from_json_schema can read: properties of dicts, `type` a string or list of
    strings, anyOf/oneOf lists of such dicts, arrays whose `items` are such objects (lists of items),
    `$defs` of such objects (pydantic's `list[Item]`), not nested without end."""
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid("schema is nested too deeply", "invalid_keys")
    if not isinstance(schema, dict):
        raise invalid("schema must be a JSON object (a JSON schema with 'properties')", "invalid_keys")
    props = schema.get("properties")
    if depth == 0 and not isinstance(props, dict):
        raise invalid("a JSON schema needs an object with 'properties'", "invalid_keys")
    if depth == 0:
        for where in ("$defs", "definitions"):
            defs = schema.get(where)
            if defs is not None and not isinstance(defs, dict):
                raise invalid(f"'{where}' must be an object", "invalid_keys")
            for d in (defs or {}).values():
                _check_schema_shape(d, depth + 1)
    if props is not None and not isinstance(props, dict):
        raise invalid("'properties' must be an object", "invalid_keys")
    for name, prop in (props or {}).items():
        if not isinstance(prop, dict):
            raise invalid(f"property {name[:64]!r} must be an object", "invalid_keys")
        _check_type(prop, depth + 1)


def _check_type(prop: dict, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid("schema is nested too deeply", "invalid_keys")
    t = prop.get("type")
    if t is not None and not isinstance(t, str) and not (isinstance(t, list) and all(isinstance(x, str) for x in t)):
        raise invalid("a property's 'type' must be a string or a list of strings", "invalid_keys")
    for option in ("anyOf", "oneOf"):
        choices = prop.get(option)
        if choices is not None:
            if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
                raise invalid(f"'{option}' must be a list of objects", "invalid_keys")
            for c in choices:
                _check_type(c, depth + 1)
    if "items" in prop:  # an array: its items are an object of string fields
        _check_schema_shape(prop["items"], depth + 1)


def parse_keys(keys: Any, schema: Any, max_keys: int, default: list[str]) -> KeySchema:
    """The keys asked for: `keys` (a list or "a,b,c"), or `schema` (a flat JSON schema, as an
    object or a JSON string), else the model's default keys."""
    if keys is not None and schema is not None:
        raise invalid("give keys or schema, not both", "invalid_keys")
    names = None
    try:
        if schema is not None:
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except (ValueError, RecursionError):
                    raise invalid("schema is not valid JSON", "invalid_keys") from None
            _check_schema_shape(schema)
            if len(schema["properties"]) > max_keys:
                raise invalid(f"{len(schema['properties'])} keys given (at most {max_keys})", "invalid_keys")
        elif keys is not None:
            if isinstance(keys, str):
                names = [k.strip() for k in split_keys(keys)]
                if not any(names):
                    raise invalid("keys is empty: give at least one key, e.g. keys=company,date,total", "invalid_keys")
            elif isinstance(keys, list):
                names = keys
            else:
                raise invalid('keys must be a list of strings or a comma-separated string "a,b,c"', "invalid_keys")
            if not names:
                raise invalid("keys is empty: give at least one key, e.g. keys=company,date,total", "invalid_keys")
            if len(names) > max_keys:
                raise invalid(f"{len(names)} keys given (at most {max_keys})", "invalid_keys")
        ks = KeySchema.resolve(KeySchema.from_names(names) if names is not None else None, schema, default=default)
    except SchemaError as e:
        raise invalid(f"bad keys: {e}", "invalid_keys") from None
    if len(ks) > max_keys:
        raise invalid(f"{len(ks)} keys given (at most {max_keys})", "invalid_keys")
    return ks


def parse_decode(decode: Any, refine_steps: Any) -> tuple[str, int]:
    decode = "pip" if decode in (None, "") else decode
    if not isinstance(decode, str) or decode not in DECODERS:
        raise invalid(f"decode must be one of {', '.join(DECODERS)}")
    if refine_steps in (None, ""):
        return decode, 0
    if isinstance(refine_steps, float) and refine_steps.is_integer():  # JSON's 2.0 is an integer
        refine_steps = int(refine_steps)
    if isinstance(refine_steps, bool) or not isinstance(refine_steps, (int, str)):
        raise invalid("refine_steps must be an integer")
    try:
        steps = int(refine_steps)
    except ValueError:
        raise invalid("refine_steps must be an integer") from None
    if not 0 <= steps <= MAX_REFINE_STEPS:
        raise invalid(f"refine_steps must be between 0 and {MAX_REFINE_STEPS}")
    if steps and not DECODERS[decode].refines:
        raise invalid(f"decode {decode} does not refine: refine_steps must be 0")
    return decode, steps


def document_error(e: DocumentError) -> ApiError:
    """The answer to a document the loaders refused: 413 over a limit, 415 unsupported, else 422."""
    status = 413 if isinstance(e, LimitExceeded) else 415 if e.code == "unsupported_type" else 422
    return ApiError(status, e.code, f"{e.path}: {e.reason}")


async def parse_extract(request: Request, settings: ServeSettings, default_keys: list[str]) -> ExtractRequest:
    """Read and check a POST /extract request (multipart upload or JSON words/text)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in ("multipart/form-data", "application/json"):
        raise ApiError(
            415,
            "unsupported_media_type",
            f"unsupported content type {ctype[:100] or 'none'!r}: send "
            "multipart/form-data (a file) or application/json (words or text)",
        )
    multipart = ctype == "multipart/form-data"
    limit = settings.max_body_bytes + (ENVELOPE_BYTES if multipart else 0)
    body = await read_body(request, limit, settings.max_upload_mb)
    name, kind, load, spec = await (_from_form(request, body, settings) if multipart else _from_json(body, settings))
    schema = parse_keys(spec.get("keys"), spec.get("schema"), settings.max_keys, default_keys)
    decode, steps = parse_decode(spec.get("decode"), spec.get("refine_steps"))
    return ExtractRequest(name, kind, load, schema, decode, steps)


async def _from_form(request: Request, body: bytes, settings: ServeSettings):
    try:
        form = await Request(request.scope, replay(body)).form(
            max_files=1, max_fields=len(FORM_FIELDS), max_part_size=1024 * 1024
        )
    except HTTPException as e:
        raise ApiError(400, "malformed_body", f"malformed multipart body: {e.detail}") from None
    except Exception:  # the multipart parser's own errors: the body's fault
        raise ApiError(400, "malformed_body", "malformed multipart body") from None
    try:
        unknown = sorted(set(form.keys()) - FORM_FIELDS)
        if unknown:
            raise invalid(f"unknown form fields {[u[:64] for u in unknown[:8]]}; expected {sorted(FORM_FIELDS)}")
        upload, text = form.get("file"), form.get("text")
        spec = {k: form.get(k) for k in ("keys", "schema", "decode", "refine_steps")}
        if any(v is not None and not isinstance(v, str) for v in spec.values()):
            raise invalid("keys, schema, decode and refine_steps must be plain form fields, not files")
        if upload is None and text is None:
            raise invalid("no document: send it as the form field 'file'")
        if isinstance(upload, str):
            raise invalid("the form field 'file' must be a file upload")
        if upload is None:
            if not isinstance(text, str) or not text.strip():
                raise invalid("text must be a non-empty string")
            return "text", "parse", _text_loader(text, None, settings), spec
        ctype = (upload.content_type or "").split(";")[0].strip().lower()
        if ctype and not ctype.startswith(UPLOAD_TYPES):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"unsupported content type {ctype[:100]!r}: send an image, a PDF, JSON words or text",
            )
        data = await upload.read()
        if len(data) > settings.max_body_bytes:
            raise ApiError(413, "body_too_large", f"upload too large: the limit is {settings.max_upload_mb:g} MB")
        name = Path(upload.filename or "upload").name[:200] or "upload"
        if not data:
            raise invalid(f"{name}: file is empty", "empty_document")
        try:
            kind = "ocr" if sniff(data, name, ctype or None) in ("image", "pdf") else "parse"
        except DocumentError as e:
            raise document_error(e) from None

        def load(cancel: threading.Event) -> Document:
            return load_document(
                data,
                filename=name,
                content_type=ctype or None,
                ocr=settings.ocr,
                threads=settings.threads,
                max_pages=settings.max_pages,
                max_pixels=settings.max_pixels,
                max_words=settings.max_words,
                cancel=cancel,
            )

        return name, kind, load, spec
    finally:
        await form.close()


def _text_loader(text: str, doc_id: Any, settings: ServeSettings):
    name = str(doc_id)[:200] if doc_id is not None else None
    n = len(text.split())
    if n > settings.max_words:
        raise ApiError(413, "too_many_words", f"{n:,} words, more than the limit of {settings.max_words:,}")
    return lambda cancel: load_document(text=text, filename=name)


async def _from_json(body: bytes, settings: ServeSettings):
    try:
        if len(body) > THREAD_PARSE_BYTES:
            obj = await asyncio.get_running_loop().run_in_executor(None, json.loads, body)
        else:
            obj = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ApiError(400, "malformed_body", "malformed JSON body") from None
    if not isinstance(obj, dict):
        raise invalid("the JSON body must be an object with 'words' or 'text'")
    unknown = sorted(set(obj) - JSON_FIELDS)
    if unknown:
        raise invalid(f"unknown fields {[u[:64] for u in unknown[:8]]}; expected {sorted(JSON_FIELDS)}")
    spec = {k: obj.get(k) for k in ("keys", "schema", "decode", "refine_steps")}
    words, text, doc_id = obj.get("words"), obj.get("text"), obj.get("id")
    if doc_id is not None and not isinstance(doc_id, (str, int)):
        raise invalid("id must be a string")
    if words is not None and text is not None:
        raise invalid("give the document as words or as text, not both")
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise invalid("text must be a non-empty string")
        return "text", "parse", _text_loader(text, doc_id, settings), spec
    if not isinstance(words, list):
        raise invalid("no document: give 'words' (a list of {text, box}) or 'text'")
    if not words:
        raise invalid("words is empty: the document has no words", "empty_document")
    if len(words) > settings.max_words:
        raise ApiError(413, "too_many_words", f"{len(words):,} words, more than the limit of {settings.max_words:,}")
    payload = {k: obj[k] for k in ("words", "page_sizes", "normalized", "id") if k in obj}
    name = f"{str(doc_id)[:200] if doc_id is not None else 'request'}.json"
    pages = max([0] + [w.get("page", 0) + 1 for w in words if isinstance(w, dict) and type(w.get("page", 0)) is int])
    if pages > settings.max_pages:
        raise ApiError(413, "too_many_pages", f"{pages} pages, more than the limit of {settings.max_pages}")
    try:  # page_sizes and their count now, before admission; the words are built by the loader
        words_document({**payload, "words": []}, Path(name).stem, name, settings.max_words, settings.max_pages)
    except DocumentError as e:
        raise document_error(e) from None

    def load(cancel: threading.Event) -> Document:
        return words_document(payload, Path(name).stem, name, settings.max_words, settings.max_pages)

    return name, "parse", load, spec
