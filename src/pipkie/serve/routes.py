"""The endpoints, on an APIRouter; the app's `Service` (request.app.state.service) does the work.

- `GET /health`: status (ok | loading | draining), model, default keys, limits, batching counters.
- `GET /metrics`: Prometheus text format (queue depth, batch sizes, latencies, rejections).
- `POST /extract`: one document in (multipart upload or JSON words/text), `Extraction.to_dict()` out.
- `POST /render`: one page of an uploaded document as a PNG, the page the boxes are relative to.

The web page (`/`) and the API docs (`/docs`, `/redoc`) are in `pipkie.serve.web`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pipkie.decoding import DECODERS
from pipkie.serve.openapi import (
    ERRORS,
    METRICS_RESPONSE,
    RENDER_BODY,
    RENDER_RESPONSES,
    REQUEST_BODY,
    TIMEOUT_PARAMETER,
    ExtractionOut,
    HealthOut,
)
from pipkie.serve.render import PAGE_COUNT_HEADER
from pipkie.serve.service import Service

router = APIRouter()


def service(request: Request) -> Service:
    return request.app.state.service


@router.get("/health", response_model=HealthOut)
async def health(request: Request):
    """Whether the service is up, what it serves and its limits."""
    svc = service(request)
    ex = svc.extractor
    status = "draining" if svc.draining else "ok" if ex is not None else "loading"
    return {
        "status": status,
        "model": Path(ex.name).name if ex is not None and ex.name else (svc.settings.model or ""),
        "keys": list(ex.settings.keys or []) if ex is not None else [],
        "decodes": list(DECODERS),
        "limits": svc.settings.public(),
        "batching": {
            **svc.batcher.stats,
            "queued": svc.batcher.queued,
            "active": svc.active,
            "estimated_wait_s": round(svc.batcher.estimated_wait(), 3),
            **svc.counts,
        },
    }


@router.get("/metrics", responses=METRICS_RESPONSE, response_class=Response)
async def metrics(request: Request):
    """Prometheus metrics of this instance."""
    m = service(request).metrics
    return Response(m.render(), media_type=m.content_type)


@router.post(
    "/extract",
    response_model=ExtractionOut,
    responses=ERRORS,
    openapi_extra={"requestBody": REQUEST_BODY, "parameters": [TIMEOUT_PARAMETER]},
)
async def extract(request: Request):
    """Extract key fields from one document (an upload or JSON words/text); see the request schemas."""
    return JSONResponse(await service(request).handle(request))


@router.post(
    "/render",
    response_class=Response,
    responses=RENDER_RESPONSES,
    openapi_extra={"requestBody": RENDER_BODY, "parameters": [TIMEOUT_PARAMETER]},
)
async def render(request: Request):
    """One page of a document as a PNG: the page its extraction's boxes are relative to (an image
    EXIF-upright, a PDF page, JSON words written on a page)."""
    page = await service(request).render_page(request)
    return Response(
        page.png, media_type="image/png", headers={PAGE_COUNT_HEADER: str(page.pages), "Cache-Control": "no-store"}
    )
