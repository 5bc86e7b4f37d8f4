"""The service's error format: a stable code, a message about the client's input, and a request id.

Every error answer is JSON `{"code": "...", "detail": "...", "request_id": "..."}` with the same id
in the `X-Request-ID` header (the client's own id when it sends a sane one, else a fresh one).
`code` is stable (clients switch on it); `detail` says what is wrong with the request and never
carries exception text or tracebacks: those go to the server log, under the request id, so an
operator can find what a client reports. Only the client's input is answered 4xx; a failure of
the server is `500 internal_error` (and the worker lives on).

| status | codes |
|---|---|
| 400 | malformed_body |
| 404 / 405 | not_found / method_not_allowed |
| 413 | body_too_large, too_many_pages, too_many_pixels, too_many_words |
| 415 | unsupported_media_type |
| 422 | invalid_request, invalid_keys, keys_do_not_fit, decode_unavailable, deadline_too_short, unreadable_document, invalid_words, empty_document, page_out_of_range and no_page_image (POST /render) |
| 499 | client_closed_request (logged only: the client is gone) |
| 500 | internal_error |
| 503 | overloaded, shutting_down, ocr_unavailable (with Retry-After) |
| 504 | timeout |
"""

from __future__ import annotations

import logging
import re
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("pipkie.serve")

REQUEST_ID_HEADER = "x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 400: "malformed_body"}


class ApiError(Exception):
    """An answer other than 200: status, stable code, client-facing detail, optional extra headers."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or "-"


def error_response(request: Request, status: int, code: str, detail: str, headers: dict | None = None) -> JSONResponse:
    rid = request_id(request)
    return JSONResponse(
        {"code": code, "detail": detail, "request_id": rid},
        status_code=status,
        headers={**(headers or {}), REQUEST_ID_HEADER: rid},
    )


class RequestIdMiddleware:
    """Pure ASGI middleware: gives every HTTP request an id (`scope["state"]["request_id"]`) and
    sends it back in `X-Request-ID` (pure ASGI, unlike BaseHTTPMiddleware, so the handler still
    sees the client disconnect)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = dict(scope.get("headers") or []).get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        rid = sent if _SANE_ID.match(sent) else uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER.encode()]
                message = {**message, "headers": headers + [(REQUEST_ID_HEADER.encode(), rid.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def install(app: FastAPI, on_error=None) -> None:
    """Exception handlers that answer in the error format; `on_error(status, code)` counts them."""

    def answer(request: Request, status: int, code: str, detail: str, headers=None) -> JSONResponse:
        if on_error is not None:
            on_error(status, code)
        return error_response(request, status, code, detail, headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return answer(request, exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        code = _HTTP_CODES.get(exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error")
        detail = exc.detail if isinstance(exc.detail, str) and exc.status_code < 500 else code.replace("_", " ")
        return answer(request, exc.status_code, code, detail, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return answer(request, 422, "invalid_request", "the request does not match the API's schema")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):  # a bug: log it, tell the client only the id
        log.error("request %s: internal error", request_id(request), exc_info=exc)
        return answer(request, 500, "internal_error", "internal error; quote the request id to the operator")
