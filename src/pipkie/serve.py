"""The extraction service: FastAPI, dynamic batching, limits that answer 4xx instead of falling over.

    pipkie serve --port 8000                                  # the shipped model (or $PIPKIE_MODEL)
    curl -F file=@receipt.jpg -F keys=company,date,total localhost:8000/extract
    curl -H 'content-type: application/json' -d '{"text": "Total 9.90", "keys": ["total"]}' \\
         localhost:8000/extract

    app = create_app(Extractor.from_pretrained("models/pipkie-sroie"), max_batch=8)

Endpoints (OpenAPI docs at /docs):
- `GET /health`: status, model, default keys, limits, and batching counters.
- `POST /extract`: `multipart/form-data` with `file` (image, PDF, JSON words, box file or text) and
  optional form fields `keys` ("a,b,c"), `schema` (a JSON-schema string), `decode`, `refine_steps`;
  or `application/json` `{"words": [...], "page_sizes": ..., "normalized": ..., "text": ...,
  "keys": [...] | "a,b", "schema": {...}, "decode": "pip", "refine_steps": 0, "id": ...}` (words as in
  `pipkie.loaders`). The answer is `Extraction.to_dict()`, the same JSON as `pipkie extract`.

How a request flows: the body is read with a size limit; the document is loaded (OCR, PDF) in a
thread pool, one request each; the loaded document is queued. One worker task takes what is queued
(up to `max_batch` requests, waiting at most `max_wait_ms` for more after the first), groups them by
(decode, refine steps, key schema) and runs one `Extractor.extract_many` per group: for PIP, one
forward pass over the group. Model calls run one at a time in a dedicated thread, so the event
loop keeps answering (health checks, uploads, queueing) while the model works.

Errors are JSON `{"detail": "..."}`: 400 malformed body, 413 upload too large, 415 unsupported
content type or file type, 422 bad keys/schema/decode, too many pages, corrupt file, a template that
does not fit the model, 503 OCR engine unavailable, 504 over `request_timeout_s`. If a batch fails,
its requests are retried one by one so that only the request that fails gets the error; the worker
itself never stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException  # what Request.form() raises (FastAPI's is a subclass)

from pipkie.batching import Batcher
from pipkie.document import Document
from pipkie.loaders import DocumentError, load_document
from pipkie.schema import KeySchema, SchemaError

log = logging.getLogger("pipkie.serve")

DECODES = ("pip", "ar", "ar-forced")
MAX_REFINE_STEPS = 8
FORM_FIELDS = {"file", "text", "keys", "schema", "decode", "refine_steps"}
JSON_FIELDS = {"words", "page_sizes", "normalized", "text", "keys", "schema", "decode", "refine_steps", "id"}
UPLOAD_TYPES = ("image/", "application/pdf", "application/json", "text/plain", "text/csv", "application/octet-stream")


class ApiError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


# ---- response models (OpenAPI docs) -------------------------------------------------------------
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


class ExtractionOut(BaseModel):
    document: str
    fields: dict[str, FieldOut]
    decode: str
    seconds: float
    truncated: bool


class ErrorOut(BaseModel):
    detail: str


class HealthOut(BaseModel):
    status: str
    model: str
    keys: list[str]
    decodes: list[str]
    limits: dict[str, Any]
    batching: dict[str, Any]


_WORD = {
    "type": "object", "required": ["text", "box"],
    "properties": {
        "text": {"type": "string"},
        "box": {"type": "array", "items": {"type": "number"}, "description": "[x0, y0, x1, y1] or 8 corners"},
        "page": {"type": "integer", "default": 0},
    },
}
_KEYS = {"description": 'keys to extract: a list or "a,b,c" (default: the model\'s keys)',
         "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]}
_REQUEST_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "file": {"type": "string", "format": "binary",
                             "description": "image (PNG, JPEG, TIFF…), PDF, JSON words, SROIE box file or text"},
                    "keys": {"type": "string", "description": "comma-separated keys, e.g. company,date,total"},
                    "schema": {"type": "string", "description": "a flat JSON schema (instead of keys), as a string"},
                    "decode": {"type": "string", "enum": list(DECODES), "default": "pip"},
                    "refine_steps": {"type": "integer", "default": 0, "minimum": 0, "maximum": MAX_REFINE_STEPS},
                },
                "required": ["file"],
            }
        },
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "words": {"type": "array", "items": _WORD, "description": "OCR words (give words or text)"},
                    "page_sizes": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}},
                                   "description": "[[w, h], ...] pixels; without it boxes are 0-1000"},
                    "normalized": {"type": "boolean", "default": False},
                    "text": {"type": "string", "description": "plain text (give words or text)"},
                    "keys": _KEYS,
                    "schema": {"type": "object", "description": "flat JSON schema (instead of keys)"},
                    "decode": {"type": "string", "enum": list(DECODES), "default": "pip"},
                    "refine_steps": {"type": "integer", "default": 0},
                    "id": {"type": "string"},
                },
            },
            "example": {"words": [{"text": "TOTAL", "box": [100, 800, 200, 820]},
                                  {"text": "9.90", "box": [700, 800, 780, 820]}],
                        "keys": ["total"], "decode": "pip"},
        },
    },
}
_ERRORS = {code: {"model": ErrorOut, "description": text} for code, text in {
    400: "malformed body", 413: "upload too large", 415: "unsupported content or file type",
    422: "bad keys, schema, decode or document", 503: "OCR engine unavailable", 504: "request timed out"}.items()}


async def _read_body(request: Request, limit: int, limit_mb: float) -> bytes:
    too_large = ApiError(413, f"upload too large: the limit is {limit_mb:g} MB")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _parse_keys(keys: Any, schema: Any, max_keys: int, default: list[str]) -> KeySchema:
    if keys is not None and schema is not None:
        raise ApiError(422, "give keys or schema, not both")
    try:
        if schema is not None:
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ApiError(422, f"schema is not valid JSON ({e})") from None
            if not isinstance(schema, dict):
                raise ApiError(422, "schema must be a JSON object (a flat JSON schema with 'properties')")
            ks = KeySchema.parse(schema)
        elif keys is not None:
            if isinstance(keys, str):
                names = [k.strip() for k in keys.split(",")]
                if not any(names):
                    raise ApiError(422, "keys is empty: give at least one key, e.g. keys=company,date,total")
            elif isinstance(keys, list):
                names = keys
            else:
                raise ApiError(422, 'keys must be a list of strings or a comma-separated string "a,b,c"')
            if not names:
                raise ApiError(422, "keys is empty: give at least one key, e.g. keys=company,date,total")
            if len(names) > max_keys:
                raise ApiError(422, f"{len(names)} keys given (at most {max_keys})")
            ks = KeySchema.parse(names)
        elif default:
            ks = KeySchema.parse(default)
        else:
            raise ApiError(422, "no keys given and the model has no default keys: give keys or schema")
    except SchemaError as e:
        raise ApiError(422, f"bad keys: {e}") from None
    if len(ks) > max_keys:
        raise ApiError(422, f"{len(ks)} keys given (at most {max_keys})")
    return ks


def _parse_decode(decode: Any, refine_steps: Any) -> tuple[str, int]:
    decode = "pip" if decode in (None, "") else decode
    if decode not in DECODES:
        raise ApiError(422, f"decode must be one of {', '.join(DECODES)}, not {decode!r}")
    try:
        steps = int(refine_steps or 0)
        if isinstance(refine_steps, float) or isinstance(refine_steps, bool):
            raise ValueError
    except (TypeError, ValueError):
        raise ApiError(422, f"refine_steps must be an integer, not {refine_steps!r}") from None
    if not 0 <= steps <= MAX_REFINE_STEPS:
        raise ApiError(422, f"refine_steps must be between 0 and {MAX_REFINE_STEPS}")
    return decode, steps


# ---- the app ------------------------------------------------------------------------------------
def create_app(extractor=None, *, max_batch: int = 8, max_wait_ms: float = 10, max_upload_mb: float = 10,
               max_pages: int = 10, max_keys: int = 32, request_timeout_s: float = 60, model: str | None = None,
               threads: int = 1, ocr: str = "rapidocr", load_workers: int = 2) -> FastAPI:
    """The service. `extractor`: an `Extractor`; None loads `model` (default: the shipped model or
    $PIPKIE_MODEL) with `threads` torch threads when the app starts (or on the first request)."""
    upload_limit = int(max_upload_mb * 2**20)
    body_limit = upload_limit + 256 * 1024  # the multipart envelope and form fields
    state: dict[str, Any] = {"extractor": extractor, "requests": 0, "errors": 0}
    lock = threading.Lock()
    pools: dict[str, ThreadPoolExecutor] = {}

    def load_pool() -> ThreadPoolExecutor:  # created on demand: the app can be started again after a stop
        if "load" not in pools:
            pools["load"] = ThreadPoolExecutor(max(1, load_workers), thread_name_prefix="pipkie-load")
        return pools["load"]

    def get_extractor():
        if state["extractor"] is None:
            with lock:
                if state["extractor"] is None:
                    from pipkie.extract import Extractor

                    state["extractor"] = Extractor.from_pretrained(model, threads=threads, ocr=ocr)
        return state["extractor"]

    batcher = Batcher(get_extractor, max_batch, max_wait_ms)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.get_running_loop().run_in_executor(None, get_extractor)
        yield
        await batcher.stop()
        if "load" in pools:
            pools.pop("load").shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="pipkie", version="0.1.0", lifespan=lifespan,
                  description="Key information extraction from documents with parallel decoding (PIP).")
    app.state.batcher = batcher
    app.state.get_extractor = get_extractor

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        state["errors"] += 1
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/docs")

    @app.get("/health", response_model=HealthOut)
    async def health():
        ex = state["extractor"]
        return {
            "status": "ok" if ex is not None else "loading",
            "model": Path(ex.name).name if ex is not None and ex.name else (model or ""),
            "keys": list(ex.settings.keys) if ex is not None else [],
            "decodes": list(DECODES),
            "limits": {"max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait * 1000,
                       "max_upload_mb": max_upload_mb, "max_pages": max_pages, "max_keys": max_keys,
                       "request_timeout_s": request_timeout_s},
            "batching": {**batcher.stats, "queued": batcher.queued, "requests": state["requests"],
                         "errors": state["errors"]},
        }

    async def _load(fn, deadline: float) -> Document:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(load_pool(), fn), max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise ApiError(504, f"request timed out after {request_timeout_s:g} s (loading the document)") from None
        except DocumentError as e:
            reason = str(e).removeprefix(f"{e.path}: ")
            raise ApiError(415 if reason.startswith("unsupported") else 422, str(e)) from None
        except Exception as e:
            from pipkie.ocr import OCREngineError

            if isinstance(e, OCREngineError):
                raise ApiError(503, f"OCR engine unavailable: {e}") from None
            # a decoder library choking on a malformed file: the input's fault, not the server's
            log.warning("document could not be read: %s: %s", type(e).__name__, e)
            raise ApiError(422, f"could not read the document ({type(e).__name__}: {e})") from None

    async def _from_form(request: Request, body: bytes):
        try:
            form = await Request(request.scope, _replay(body)).form(max_files=1, max_fields=len(FORM_FIELDS),
                                                                    max_part_size=1024 * 1024)
        except HTTPException as e:
            raise ApiError(400, f"malformed multipart body: {e.detail}") from None
        except Exception as e:
            raise ApiError(400, f"malformed multipart body: {e}") from None
        try:
            unknown = sorted(set(form.keys()) - FORM_FIELDS)
            if unknown:
                raise ApiError(422, f"unknown form fields {unknown}; expected {sorted(FORM_FIELDS)}")
            upload, text = form.get("file"), form.get("text")
            spec = {k: form.get(k) for k in ("keys", "schema", "decode", "refine_steps")}
            if upload is None and text is None:
                raise ApiError(422, "no document: send it as the form field 'file'")
            if isinstance(upload, str):
                raise ApiError(422, "the form field 'file' must be a file upload")
            if upload is not None:
                ctype = (upload.content_type or "").split(";")[0].strip().lower()
                if ctype and not ctype.startswith(UPLOAD_TYPES):
                    raise ApiError(415, f"unsupported content type {ctype!r}: send an image, a PDF, JSON words or text")
                data = await upload.read()
                if len(data) > upload_limit:
                    raise ApiError(413, f"upload too large: the limit is {max_upload_mb:g} MB")
                if not data:
                    raise ApiError(422, f"{upload.filename or 'file'}: file is empty")
                name = Path(upload.filename or "upload").name

                def fn():
                    return load_document(data, filename=name, content_type=ctype or None, ocr=ocr, threads=threads,
                                         max_pages=max_pages)
            else:
                def fn():
                    return load_document(text=str(text))
            return fn, spec
        finally:
            await form.close()

    def _from_json(body: bytes):
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}") from None
        if not isinstance(obj, dict):
            raise ApiError(422, "the JSON body must be an object with 'words' or 'text'")
        unknown = sorted(set(obj) - JSON_FIELDS)
        if unknown:
            raise ApiError(422, f"unknown fields {unknown}; expected {sorted(JSON_FIELDS)}")
        spec = {k: obj.get(k) for k in ("keys", "schema", "decode", "refine_steps")}
        words, text, doc_id = obj.get("words"), obj.get("text"), obj.get("id")
        if words is not None and text is not None:
            raise ApiError(422, "give the document as words or as text, not both")
        if text is not None:
            if not isinstance(text, str) or not text.strip():
                raise ApiError(422, "text must be a non-empty string")
            name = str(doc_id) if doc_id is not None else None

            def fn():
                return load_document(text=text, filename=name)
            return fn, spec
        if not isinstance(words, list):
            raise ApiError(422, "no document: give 'words' (a list of {text, box}) or 'text'")
        sizes = obj.get("page_sizes") or []
        pages = max([len(sizes) if isinstance(sizes, list) else 0]
                    + [w.get("page", 0) + 1 for w in words if isinstance(w, dict) and isinstance(w.get("page", 0), int)])
        if pages > max_pages:
            raise ApiError(422, f"{pages} pages, more than the limit of {max_pages}")
        payload = {k: obj[k] for k in ("words", "page_sizes", "normalized", "id") if k in obj}
        if not words:
            raise ApiError(422, "words is empty: the document has no words")
        data = json.dumps(payload).encode()
        name = f"{doc_id if doc_id is not None else 'request'}.json"

        def fn():
            return load_document(data, filename=name, content_type="application/json", max_pages=max_pages)
        return fn, spec

    @app.post("/extract", response_model=ExtractionOut, responses=_ERRORS, openapi_extra={"requestBody": _REQUEST_BODY})
    async def extract(request: Request):
        """Extract key fields from one document (an upload or JSON words/text); see the request schemas."""
        state["requests"] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request_timeout_s
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("multipart/form-data", "application/json"):
            raise ApiError(415, f"unsupported content type {ctype or 'none'!r}: send multipart/form-data "
                                "(a file) or application/json (words or text)")
        body = await _read_body(request, body_limit if ctype == "multipart/form-data" else upload_limit,
                                max_upload_mb)
        fn, spec = await _from_form(request, body) if ctype == "multipart/form-data" else _from_json(body)
        ex = get_extractor()
        schema = _parse_keys(spec["keys"], spec["schema"], max_keys, list(ex.settings.keys or []))
        decode, steps = _parse_decode(spec["decode"], spec["refine_steps"])
        doc = await _load(fn, deadline)
        future = await batcher.submit(doc, schema, decode, steps)
        try:
            result = await asyncio.wait_for(future, max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise ApiError(504, f"request timed out after {request_timeout_s:g} s (waiting for the model)") from None
        except ValueError as e:  # DocumentTooLong (template does not fit), bad schema for this model…
            raise ApiError(422, f"cannot extract: {e}") from None
        except Exception as e:
            log.exception("extraction failed")
            state["errors"] += 1
            return JSONResponse({"detail": f"extraction failed: {type(e).__name__}: {e}"}, status_code=500)
        return JSONResponse(result.to_dict())

    return app


def run(host: str = "127.0.0.1", port: int = 8000, **kw) -> None:
    """Serve `create_app(**kw)` with uvicorn (one process; batching needs the single worker)."""
    import uvicorn

    uvicorn.run(create_app(**kw), host=host, port=port, log_level="info")
