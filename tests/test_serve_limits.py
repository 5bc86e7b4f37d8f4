"""The service's limits: each a setting, each exceeded limit a 413/422 with the limit in the message,
answered fast and without decoding what is too large (issue 15's probes, on the tiny model)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from pipkie.serve import create_app
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401
from tests.test_loaders import make_text_pdf, no_ocr  # noqa: F401
from tests.test_serve import WORDS, error, ok

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "load_test.py"


@pytest.fixture(scope="module")
def load_test():
    spec = importlib.util.spec_from_file_location("load_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def client(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_upload_mb=1, max_pages=2, max_words=50)) as c:
        yield c


def test_ten_megabytes_of_words_on_one_line_are_refused_fast(tiny_extractor, load_test, monkeypatch):
    """Refused on the word count, before a single Word is built (so before reading order or the
    model): fast whatever the machine's load, which a timed assert could not promise."""
    from pipkie.io import loaders

    def no_word(*args, **kwargs):
        raise AssertionError("a Word was built for a document over the word limit")

    monkeypatch.setattr(loaders, "Word", no_word)
    body = json.dumps(load_test.one_line_payload(210_000)).encode()
    assert 9.5 * 2**20 < len(body) <= 10 * 2**20  # just under the default body limit
    with TestClient(create_app(tiny_extractor)) as c:
        res = c.post("/extract", content=body, headers={"content-type": "application/json"})
        error(res, 413, "too_many_words", "210,000 words", "limit of 10,000")
        # a little more than 10 MB is not even parsed
        error(
            c.post("/extract", content=body + b" " * 2**19, headers={"content-type": "application/json"}),
            413,
            "body_too_large",
            "10 MB",
        )


def test_a_request_behind_a_6000_word_line_is_answered_quickly(tiny_extractor, load_test):
    """The reading-order probe: 6,000 words on one line no longer stall the model thread."""
    app = create_app(tiny_extractor)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
            long = asyncio.create_task(c.post("/extract", json=load_test.one_line_payload(6000)))
            await asyncio.sleep(0.05)
            behind = await c.post("/extract", json={**WORDS, "keys": ["total"]})
            return await long, behind

    long, behind = asyncio.run(scenario())
    ok(long)
    ok(behind, ["total"])  # how quickly: `scripts/load_test.py --probes` times it (bound 8 s)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_huge_png_is_refused_from_its_header(client, load_test, no_ocr, monkeypatch):
    bomb = load_test.bomb_png(12000, 12000)
    assert len(bomb) < 1_000_000 and Image.open(io.BytesIO(bomb)).size == (12000, 12000)
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("the image was decoded"))
    res = client.post("/extract", files={"file": ("bomb.png", bomb, "image/png")})
    error(res, 413, "too_many_pixels", "bomb.png", "12000x12000", "limit of 40,000,000")


def test_pixel_limit_is_a_setting(tiny_extractor, no_ocr):
    buf = io.BytesIO()
    Image.new("L", (300, 200), 255).save(buf, "PNG")
    with TestClient(create_app(tiny_extractor, max_pixels=50_000)) as c:
        error(
            c.post("/extract", files={"file": ("a.png", buf.getvalue(), "image/png")}),
            413,
            "too_many_pixels",
            "60,000 pixels",
            "limit of 50,000",
        )


def test_pages_over_the_limit(client, no_ocr):
    pdf = make_text_pdf([[(72, 720, 12, "page")]] * 3)
    error(
        client.post("/extract", files={"file": ("three.pdf", pdf, "application/pdf")}),
        413,
        "too_many_pages",
        "3 pages",
        "limit of 2",
    )
    frames = [Image.new("RGB", (40, 30), "white") for _ in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "TIFF", save_all=True, append_images=frames[1:])
    error(
        client.post("/extract", files={"file": ("scan.tiff", buf.getvalue(), "image/tiff")}),
        413,
        "too_many_pages",
        "3 pages",
    )
    error(
        client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 1, 1], "page": 2}]}),
        413,
        "too_many_pages",
        "3 pages",
        "limit of 2",
    )
    error(
        client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 1, 1]}], "page_sizes": [[10, 10]] * 3}),
        413,
        "too_many_pages",
        "3 pages",
    )


def test_words_over_the_limit_in_every_form(client):
    many = " ".join(f"w{i}" for i in range(51))
    error(
        client.post("/extract", json={"words": [{"text": "w", "box": [0, 0, 1, 1]}] * 51}),
        413,
        "too_many_words",
        "51 words",
        "limit of 50",
    )
    error(client.post("/extract", json={"text": many}), 413, "too_many_words", "51 words")
    error(client.post("/extract", files={"file": ("n.txt", many.encode(), "text/plain")}), 413, "too_many_words")
    pdf = make_text_pdf([[(72, 700 - 12 * i, 10, " ".join(f"a{j}" for j in range(10))) for i in range(6)]])
    error(
        client.post("/extract", files={"file": ("long.pdf", pdf, "application/pdf")}),
        413,
        "too_many_words",
        "long.pdf",
        "60 words",
    )
    ok(client.post("/extract", json={"text": " ".join(f"w{i}" for i in range(50))}))


def test_body_over_the_limit_with_and_without_content_length(client):
    error(
        client.post("/extract", files={"file": ("big.png", b"\x89PNG" + bytes(1_200_000), "image/png")}),
        413,
        "body_too_large",
        "1 MB",
    )
    error(client.post("/extract", json={"text": "x" * 1_100_000}), 413, "body_too_large")

    def chunks():  # chunked transfer: no content-length to refuse it by
        yield b'{"text": "'
        for _ in range(40):
            yield b"y" * 32_768
        yield b'"}'

    error(
        client.post("/extract", content=chunks(), headers={"content-type": "application/json"}), 413, "body_too_large"
    )
    assert client.get("/health").json()["limits"]["max_upload_mb"] == 1


def test_keys_over_the_limit(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_keys=3)) as c:
        error(
            c.post("/extract", json={"text": "x", "keys": ["a", "b", "c", "d"]}),
            422,
            "invalid_keys",
            "4 keys",
            "at most 3",
        )
        schema = {"properties": {k: {"type": "string"} for k in "abcd"}}
        error(c.post("/extract", json={"text": "x", "schema": schema}), 422, "invalid_keys", "at most 3")
        ok(c.post("/extract", json={"text": "x", "keys": "a,b,c"}), ["a", "b", "c"])
