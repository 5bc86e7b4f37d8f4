"""The FastAPI app and how it is served: `create_app` wires settings, service, the API's and the
pages' routes (`web`) and error format; the app drains on SIGTERM whichever server runs it
(`drain_on_signals`); `run` serves it with uvicorn."""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from PIL import Image

from pipkie.serve import errors, web
from pipkie.serve.routes import router
from pipkie.serve.service import Service
from pipkie.serve.settings import ServeSettings

SHUTDOWN_GRACE_S = 30.0  # SIGTERM: admitted requests get this long to finish, then 503 shutting_down


def create_app(extractor=None, settings: ServeSettings | None = None, **overrides) -> FastAPI:
    """The service. `extractor`: an `Extractor`, or None to load `settings.model` (default: the
    shipped model or $PIPKIE_MODEL) when the app starts. `settings`: a ServeSettings (default:
    `ServeSettings.from_env()`); keyword overrides (max_batch=4, ...) are applied on top."""
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = ServeSettings(**{**settings.model_dump(), **given}) if settings else ServeSettings.from_env(**given)
    service = Service(settings, extractor)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        restore = drain_on_signals(service)
        yield
        restore()
        await service.stop()

    app = FastAPI(
        title="pipkie",
        version="0.1.0",
        lifespan=lifespan,
        routes=[*router.routes, *web.router.routes],
        docs_url=None,
        redoc_url=None,  # web.router serves them, with local assets
        description="Key information extraction from documents with parallel decoding (PIP). Errors: "
        "`{code, detail, request_id}`; limits: GET /health. A page for people: `/`.",
    )
    web.mount_static(app)
    app.state.service, app.state.batcher = service, service.batcher
    app.add_middleware(errors.RequestIdMiddleware)
    errors.install(app, on_error=service.metrics.answered)
    # a cut document is reported in the answer (`truncated`) and the pixel limit is checked from the
    # header: as warnings, every distinct token count or image size would also grow the warnings
    # registry of a long-running service
    warnings.filterwarnings("ignore", message=r"document has \d+ tokens; only \d+ fit")
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return app


def drain_on_signals(service: Service, grace_s: float = SHUTDOWN_GRACE_S) -> Callable[[], None]:
    """Chain SIGTERM/SIGINT: first start draining the service (new requests 503 at once, admitted
    ones finish for up to `grace_s`, the rest 503 shutting_down), then call the handler that was
    there (the server's: uvicorn stops accepting and waits for the connections to close). Only in
    the main thread (where signals are handled); returns what restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig, frame):
        service.begin_drain(grace_s)
        prev = previous[sig]
        if callable(prev):
            prev(sig, frame)
        else:  # no server handler: the default action (terminate)
            signal.signal(sig, prev or signal.SIG_DFL)
            signal.raise_signal(sig)

    for sig in previous:
        signal.signal(sig, handler)

    def restore():
        for sig, prev in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prev)

    return restore


def run(
    host: str = "127.0.0.1",
    port: int = 8000,
    extractor=None,
    settings: ServeSettings | None = None,
    log_level: str = "warning",
    **overrides,
) -> None:
    """Serve `create_app(extractor, settings, **overrides)` with uvicorn in one process (batching
    needs the single worker); uvicorn's own grace period outlasts the app's drain."""
    import uvicorn

    uvicorn.run(
        create_app(extractor, settings, **overrides),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S + 5),
    )
