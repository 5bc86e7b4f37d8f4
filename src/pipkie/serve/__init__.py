"""The extraction service: FastAPI, dynamic batching, bounded resources and back-pressure.

    pipkie serve --port 8000                                  # the shipped model (or $PIPKIE_MODEL)
    curl -F file=@receipt.jpg -F keys=company,date,total localhost:8000/extract
    curl -H 'content-type: application/json' -d '{"text": "Total 9.90", "keys": ["total"]}' \\
         localhost:8000/extract

    app = create_app(Extractor.from_pretrained("models/pipkie"), max_batch=8)

A page for people at `/` (drop a document, see its fields on the page, fix them, download the
JSON; docs/WEB.md). Endpoints (OpenAPI docs at /docs, served offline): `GET /health`, `GET /metrics`
(Prometheus), `POST /render` (one page of a document as a PNG, the page its boxes are on), `POST /extract`:
`multipart/form-data` with `file` (image, PDF, JSON words, box file or text) and optional form
fields `keys` ("a,b,c"), `schema` (a JSON-schema string), `decode`, `refine_steps`; or
`application/json` `{"words": [...], "page_sizes": ..., "normalized": ..., "text": ..., "keys":
[...] | "a,b", "schema": {...}, "decode": "pip", "refine_steps": 0, "id": ...}` (words as in
`pipkie.io.loaders`). The answer is `Extraction.to_dict()`, the same JSON as `pipkie extract`. A
request may shorten or lengthen its deadline with `X-Request-Timeout: <seconds>`.

Modules, one job each:
- `settings`: `ServeSettings`, every limit with its default, `PIPKIE_*` environment variables;
- `parsing`: the request (body size, form/JSON, keys, decode, deadline) -> `ExtractRequest`;
- `service`: admission and back-pressure, bounded loading, the model queue (`pipkie.serve.batcher`),
  cancellation, drain on shutdown;
- `errors`: `{code, detail, request_id}` answers, request ids, exception handlers;
- `routes`: the APIRouter; `openapi`: response models and request bodies; `telemetry`: /metrics;
- `render`: POST /render (a page image drawn by the loaders' code); `web`: the page at `/` (its
  files in `static/`) and /docs with assets from the pinned `fastapi-offline`;
- `app`: `create_app`, draining on SIGTERM (`drain_on_signals`), and `run` (uvicorn).
"""

from pipkie.serve.app import create_app, drain_on_signals, run
from pipkie.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app", "drain_on_signals", "run"]
