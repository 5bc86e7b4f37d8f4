"""The pages and POST /render without a browser: every page and asset comes from the service (no
outside URL), the page's script finds what it needs in its HTML, the static files ship with the
package, and /render draws the page the loaders read (EXIF-upright images, TIFF frames, PDF pages,
JSON words) within the service's limits. The browser's view of it all is test_web_browser.py."""

from __future__ import annotations

import fnmatch
import io
import json
import re
import tomllib
from urllib.parse import urljoin

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from pipkie.serve import create_app
from pipkie.serve.render import RENDER_SIDE
from pipkie.serve.web import STATIC
from tests.test_extract import ROOT, SAMPLE, tiny_extractor, tiny_model_dir  # noqa: F401
from tests.test_loaders import make_text_pdf
from tests.test_serve import error

PAGES = ["/", "/docs", "/docs/oauth2-redirect"]
# what a page loads: src/href attributes, CSS url(...) and @import, Swagger UI's spec `url:`
REFERENCE = re.compile(
    r"""(?:\b(?:src|href)\s*=\s*["']([^"']*)["']|url\(\s*["']?([^"')]*)|@import\s+["']([^"']+)"""
    r"""|\burl:\s*'([^']*)')""",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def client(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_upload_mb=1, max_pages=3, max_pixels=5_000_000, max_words=50)) as c:
        yield c


def references(text: str) -> list[str]:
    return [next(g for g in m.groups() if g is not None) for m in REFERENCE.finditer(text)]


def render(client, name: str, data: bytes, content_type: str, **form):
    return client.post("/render", files={"file": (name, data, content_type)}, data=form)


def png(res) -> Image.Image:
    assert res.status_code == 200, res.text
    assert res.headers["content-type"] == "image/png"
    return Image.open(io.BytesIO(res.content))


# ---- pages and assets ----------------------------------------------------------------------------
def test_every_page_and_everything_it_loads_comes_from_the_service(client):
    base, seen = "http://testserver", set()
    todo = [base + p for p in PAGES]
    while todo:
        page = todo.pop()
        res = client.get(page)
        assert res.status_code == 200, page
        kind = res.headers["content-type"].split(";")[0]
        if kind not in ("text/html", "text/css"):
            continue
        for ref in references(res.text):
            assert not re.match(r"^\s*(https?:)?//", ref, re.IGNORECASE), f"{page} loads {ref} from outside the service"
            if ref.startswith(("data:", "#", "javascript:")) or not ref.strip():
                continue
            target = urljoin(page, ref)
            if target not in seen:
                seen.add(target)
                todo.append(target)
    loaded = {u.removeprefix(base) for u in seen}
    assert {
        "/static/app.js",
        "/static/app.css",
        "/static/favicon.svg",
        "/docs-assets/swagger-ui-bundle.js",
        "/docs-assets/swagger-ui.css",
        "/openapi.json",
    } <= loaded
    assert client.get("/redoc").status_code == 404  # its bundle loads a logo from a CDN: not served


def test_the_page_is_confined_to_the_service():
    """The page's own policy: the browser fetches nothing from anywhere else (tested live in the
    browser test); the script calls only the service's relative endpoints."""
    from pipkie.serve.web import PAGE_POLICY

    assert "default-src 'self'" in PAGE_POLICY and "http" not in PAGE_POLICY
    script = (STATIC / "app.js").read_text()
    assert set(re.findall(r"""\b(?:fetch|call)\(\s*["']([^"']+)["']""", script)) == {"health", "extract", "render"}


def test_the_script_finds_every_element_it_uses(client):
    html = client.get("/").text
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    used = set(re.findall(r"""\$\(["']([\w-]+)["']\)""", (STATIC / "app.js").read_text()))
    assert used and used <= ids, sorted(used - ids)
    assert client.get("/").headers["content-security-policy"].startswith("default-src 'self'")


def test_the_static_files_are_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pipkie"]
    files = [p.relative_to(STATIC.parents[1]).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert {"serve/static/index.html", "serve/static/app.js", "serve/static/app.css"} <= set(files)
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files), files


# ---- POST /render ----------------------------------------------------------------------------------
def test_an_image_is_drawn_as_it_was_read(client):
    im = png(render(client, "receipt.jpg", SAMPLE.read_bytes(), "image/jpeg"))
    assert im.size == (round(664 * RENDER_SIDE / 1664), RENDER_SIDE)  # 664 x 1664, as OCR saw it
    # an EXIF-rotated photo is drawn upright, as the loaders read it: 200 x 100 stored, 100 x 200 shown
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    out = io.BytesIO()
    Image.new("RGB", (200, 100), "red").save(out, format="JPEG", exif=exif)
    res = render(client, "photo.jpg", out.getvalue(), "image/jpeg")
    assert png(res).size == (100, 200) and res.headers["x-page-count"] == "1"


def test_each_frame_of_a_tiff_is_a_page(client):
    out = io.BytesIO()
    frames = [Image.new("RGB", (40, 30), c) for c in ("red", "blue")]
    frames[0].save(out, format="TIFF", save_all=True, append_images=frames[1:])
    res = render(client, "scan.tiff", out.getvalue(), "image/tiff", page="1")
    assert res.headers["x-page-count"] == "2" and png(res).convert("RGB").getpixel((5, 5)) == (0, 0, 255)
    error(
        render(client, "scan.tiff", out.getvalue(), "image/tiff", page="2"),
        422,
        "page_out_of_range",
        "there is no page 2",
        "2 pages",
    )


def test_pdf_pages(client):
    pdf = make_text_pdf([[(72, 720, 14, "ACME")], [(72, 300, 40, "TOTAL 9.90")]])
    res = render(client, "inv.pdf", pdf, "application/pdf", page="1")
    im = png(res)
    assert res.headers["x-page-count"] == "2" and max(im.size) == RENDER_SIDE
    assert abs(im.width / im.height - 612 / 792) < 0.01
    dark = np.flatnonzero(np.asarray(im.convert("L")).min(axis=1) < 100)  # rows with text
    assert dark.size and 0.55 < dark[0] / im.height < 0.65  # the text 300 pt above the bottom of 792
    assert png(render(client, "inv.pdf", pdf, "application/pdf")).size == im.size
    error(
        render(client, "inv.pdf", make_text_pdf([[(72, 700, 12, "x")]] * 4), "application/pdf"),
        413,
        "too_many_pages",
        "4 pages",
        "limit of 3",
    )


def test_json_words_are_written_on_their_page(client):
    words = {"words": [{"text": "TOTAL", "box": [100, 800, 300, 850]}], "page_sizes": [[500, 1000]], "normalized": True}
    res = render(client, "words.json", json.dumps(words).encode(), "application/json")
    im = png(res).convert("L")
    assert im.size == (RENDER_SIDE // 2, RENDER_SIDE) and res.headers["x-page-count"] == "1"
    inside = im.crop((int(0.1 * im.width), int(0.8 * im.height), int(0.3 * im.width), int(0.85 * im.height)))
    outside = im.crop((0, 0, im.width, int(0.7 * im.height)))
    assert inside.getextrema()[0] < 100 and outside.getextrema()[0] == 255  # the word, in its box; nothing else


def test_bad_render_requests(client):
    error(render(client, "note.txt", b"Total 9.90", "text/plain"), 422, "no_page_image", "no page to show")
    error(render(client, "scan.pdf", b"not a pdf", "application/pdf"), 422, "unreadable_document", "not a PDF")
    error(render(client, "r.png", b"\x89PNG\r\n\x1a\nbroken", "image/png"), 422, "unreadable_document", "r.png")
    error(render(client, "a.zip", b"PK\x03\x04", "application/zip"), 415, "unsupported_media_type", "zip")
    error(
        render(client, "r.jpg", SAMPLE.read_bytes(), "image/jpeg", page="first"), 422, "invalid_request", "page must be"
    )
    error(render(client, "r.jpg", SAMPLE.read_bytes(), "image/jpeg", page="-1"), 422, "invalid_request")
    error(render(client, "r.jpg", b"", "image/jpeg"), 422, "empty_document", "empty")
    error(client.post("/render", files={"page": (None, "0")}), 422, "invalid_request", "no document")
    error(
        client.post("/render", files={"file": ("r.jpg", b"x")}, data={"colour": "red"}),
        422,
        "invalid_request",
        "unknown form fields",
    )
    error(client.post("/render", json={"text": "x"}), 415, "unsupported_media_type", "multipart/form-data")
    error(render(client, "big.png", b"\x89PNG" + b"0" * (2**20 + 10), "image/png"), 413, "body_too_large", "1 MB")
    big = io.BytesIO()
    Image.new("L", (3000, 2000)).save(big, format="PNG")
    error(render(client, "big.png", big.getvalue(), "image/png"), 413, "too_many_pixels", "6,000,000", "5,000,000")
    words = {"words": [{"text": f"w{i}", "box": [0, 0, 10, 10]} for i in range(60)]}
    error(
        render(client, "w.json", json.dumps(words).encode(), "application/json"), 413, "too_many_words", "limit of 50"
    )
    error(
        client.post(
            "/render", files={"file": ("r.jpg", SAMPLE.read_bytes(), "image/jpeg")}, headers={"X-Request-Timeout": "0"}
        ),
        422,
        "invalid_request",
        "X-Request-Timeout",
    )
