"""The pages for people, every asset served by the service itself (nothing from a CDN: the service
is often run offline or behind a firewall, where a CDN-backed page is blank).

- `GET /`: the extraction page (`static/index.html`, `app.js`, `app.css`: plain HTML and a small
  script, no build step). A person drops a document, sees each field's boxes on the page the
  service read (POST /render), the value and confidence of each field, edits values and downloads
  the JSON. docs/WEB.md describes it.
  Its Content-Security-Policy lets the browser fetch nothing from anywhere but the service.
- `GET /docs`: Swagger UI of /openapi.json, its JavaScript and CSS from the pinned
  `fastapi-offline` package (Swagger UI 5), mounted at `/docs-assets`; its validator badge (an
  image from an outside site) is off. ReDoc (FastAPI's `/redoc`) is not served: its bundle always
  loads a logo from its vendor's CDN.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import (
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
DOCS_ASSETS = "/docs-assets"  # fastapi_offline/static: swagger-ui-bundle.js, swagger-ui.css
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
PAGE_POLICY = (
    "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; base-uri 'self'; "
    "form-action 'self'; frame-ancestors 'self'"
)
SWAGGER_PARAMETERS = {
    "dom_id": "#swagger-ui",
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    "validatorUrl": None,
}

router = APIRouter(include_in_schema=False)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/")
async def page():
    return FileResponse(
        STATIC / "index.html",
        media_type="text/html",
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": PAGE_POLICY},
    )


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title="pipkie - API (Swagger UI)",
        swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}/static/favicon.svg",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT}",
        swagger_ui_parameters=SWAGGER_PARAMETERS,
    )


@router.get(OAUTH2_REDIRECT)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


def mount_static(app: FastAPI) -> None:
    """The pages' static files: ours at /static, the docs' at /docs-assets."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount(DOCS_ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")
