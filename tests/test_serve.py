"""The service: uploads and JSON, every bad input answered 4xx with a message, dynamic batching,
failures confined to their request, timeouts, a loop that keeps answering while the model works."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from pipkie.serve import create_app
from tests.test_extract import (  # noqa: F401
    BOX_FILE, KEYS, SAMPLE, answering, check_extraction, needs_sroie, receipt_doc, tiny_extractor, tiny_model_dir,
)
from tests.test_loaders import make_text_pdf

WORDS = {"words": [{"text": "ACME", "box": [100, 50, 300, 80]}, {"text": "TOTAL", "box": [100, 800, 200, 820]},
                   {"text": "9.90", "box": [700, 800, 780, 820]}]}


@pytest.fixture
def client(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_upload_mb=1, max_pages=2, max_keys=8)) as c:
        yield c


def ok(res, keys=KEYS):
    assert res.status_code == 200, res.text
    return check_extraction(_as_extraction(res.json()), keys, res.json()["decode"])


def _as_extraction(d):
    from pipkie.extract import Box, Extraction, Field

    return Extraction(d["document"], {k: Field(f["value"], f["confidence"], [Box(**b) for b in f["boxes"]], f["grounding"])
                                      for k, f in d["fields"].items()}, d["decode"], d["seconds"], d["truncated"])


def error(res, status: int, *fragments: str) -> str:
    assert res.status_code == status, (res.status_code, res.text)
    detail = res.json()["detail"]
    assert isinstance(detail, str) and detail
    for f in fragments:
        assert f in detail, detail
    return detail


# ---- the happy paths ------------------------------------------------------------------------------
def test_health_and_docs(client, tiny_extractor):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "pipkie-tiny-model" and h["keys"] == KEYS
    assert h["limits"]["max_keys"] == 8 and "queued" in h["batching"]
    assert client.get("/docs").status_code == 200
    body = client.get("/openapi.json").json()["paths"]["/extract"]["post"]["requestBody"]["content"]
    assert set(body) == {"multipart/form-data", "application/json"}


def test_multipart_real_receipt_image(client, receipt_doc):  # receipt_doc: the OCR engine is warm
    with open(SAMPLE, "rb") as f:
        res = client.post("/extract", files={"file": ("receipt.jpg", f, "image/jpeg")},
                          data={"keys": "company,total", "decode": "pip"})
    d = ok(res, ["company", "total"])
    assert d["document"] == "receipt"


def test_multipart_pdf_text_and_schema(client):
    pdf = make_text_pdf([[(72, 720, 14, "ACME TRADING"), (72, 300, 12, "TOTAL 9.90")]])
    ok(client.post("/extract", files={"file": ("inv.pdf", pdf, "application/pdf")}))
    ok(client.post("/extract", files={"file": ("note.txt", b"Total 9.90", "text/plain")}, data={"keys": "total"}),
       ["total"])
    schema = {"type": "object", "properties": {"total": {"type": "string", "maxLength": 12}, "vendor": {"type": "string"}}}
    ok(client.post("/extract", files={"file": ("note.txt", b"Total 9.90", "text/plain")},
                   data={"schema": json.dumps(schema)}), ["total", "vendor"])


def test_json_words_and_text(client, tiny_extractor):
    d = ok(client.post("/extract", json={**WORDS, "keys": ["total"], "id": "w1"}), ["total"])
    assert d["document"] == "w1"
    ok(client.post("/extract", json={"text": "Total 9.90", "keys": "company,total", "decode": "ar-forced"}),
       ["company", "total"])
    ok(client.post("/extract", json={"text": "Total 9.90", "refine_steps": 1}))
    # the same JSON as the Python API / CLI
    same = tiny_extractor.extract(None, ["total"], text="Total 9.90").to_dict()
    got = client.post("/extract", json={"text": "Total 9.90", "keys": ["total"]}).json()
    assert {**got, "seconds": 0} == {**same, "seconds": 0}


@needs_sroie
def test_json_words_from_precomputed_ocr(client, tiny_extractor, monkeypatch):
    words = []
    for line in BOX_FILE.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split(",", 8)
        if len(parts) == 9:
            words.append({"text": parts[8], "box": [int(v) for v in parts[:8]]})
    monkeypatch.setattr("pipkie.extract.pip_decode", answering({"total": "85.54"}))
    d = ok(client.post("/extract", json={"words": words, "page_sizes": [[664, 1664]], "id": BOX_FILE.stem}))
    assert d["fields"]["total"]["grounding"] == "exact" and d["fields"]["total"]["boxes"]


# ---- bad inputs: 4xx and a message ----------------------------------------------------------------
def test_bad_keys(client):
    post = lambda **data: client.post("/extract", files={"file": ("n.txt", b"Total 9.90", "text/plain")}, data=data)  # noqa: E731
    error(post(keys=" , "), 422, "keys is empty")
    error(client.post("/extract", json={"text": "x", "keys": []}), 422, "keys is empty")
    error(post(keys=",".join(f"k{i}" for i in range(9))), 422, "9 keys", "at most 8")
    error(post(keys="a" * 65), 422, "65 characters")
    error(post(keys="to:tal"), 422, "characters other than")
    error(post(keys="total", schema="{}"), 422, "not both")
    error(post(schema="{not json"), 422, "not valid JSON")
    error(post(schema=json.dumps({"properties": {"n": {"type": "integer"}}})), 422, "must be a string")
    error(post(keys="total", decode="beam"), 422, "decode must be one of")
    error(post(keys="total", refine_steps="99"), 422, "refine_steps")
    error(post(keys="total", key="oops"), 422, "unknown form fields")
    # keys whose mask budgets leave no room for the document: refused by the model worker, as a 422
    big = {"type": "object", "properties": {f"k{i}": {"type": "string", "x-max-tokens": 256} for i in range(5)}}
    error(post(schema=json.dumps(big)), 422, "cannot extract")


def test_bad_content(client):
    error(client.post("/extract", content=b"<xml/>", headers={"content-type": "text/xml"}), 415, "content type")
    error(client.post("/extract", files={"file": ("a.zip", b"PK\x03\x04", "application/zip")}), 415, "application/zip")
    error(client.post("/extract", files={"file": ("a.bin", b"\x00\x01\x02\xff\xfe", "application/octet-stream")}),
          415, "unsupported")
    error(client.post("/extract", files={"file": ("r.jpg", b"\xff\xd8\xff\xe0 truncated jpeg", "image/jpeg")}),
          422, "r.jpg")
    error(client.post("/extract", files={"file": ("r.png", b"garbage", "image/png")}), 422, "not a readable image")
    error(client.post("/extract", files={"file": ("big.png", b"\x89PNG" + bytes(1_200_000), "image/png")}), 413, "1 MB")
    error(client.post("/extract", content=b"{\"text\": ", headers={"content-type": "application/json"}), 400,
          "malformed JSON")
    error(client.post("/extract", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data"}),
          400, "malformed multipart")
    error(client.post("/extract", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data; boundary=x"}),
          422, "no document")
    error(client.post("/extract", json=[1, 2]), 422, "object")
    error(client.post("/extract", json={"keys": ["total"]}), 422, "no document")
    error(client.post("/extract", json={"text": "a", "words": []}), 422, "not both")
    error(client.post("/extract", json={"words": [{"text": "x", "box": [1, 2]}]}), 422, "box must be")
    error(client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 5000, 10]}]}), 422, "0-1000")
    error(client.post("/extract", json={**WORDS, "colour": 1}), 422, "unknown fields")
    error(client.post("/extract", data={"keys": "total"}, files={"other": ("x", b"1")}), 422, "unknown form fields")
    error(client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 1, 1], "page": 2}],
                                        "page_sizes": [[10, 10]] * 3}), 422, "3 pages", "limit of 2")
    pdf = make_text_pdf([[(72, 720, 12, "page")]] * 3)
    error(client.post("/extract", files={"file": ("three.pdf", pdf, "application/pdf")}), 422, "3 pages")
    assert client.get("/health").json()["status"] == "ok"


def test_a_decoder_library_crash_is_the_documents_fault(client, monkeypatch):
    """A malformed file that makes a decoder library raise something unexpected: 422, not 500."""
    import struct

    import pipkie.serve

    def broken(*a, **kw):
        raise struct.error("unpack requires a buffer of 4 bytes")

    monkeypatch.setattr(pipkie.serve, "load_document", broken)
    error(client.post("/extract", files={"file": ("r.png", b"\x89PNG....", "image/png")}), 422, "could not read",
          "unpack requires")
    assert client.get("/health").json()["status"] == "ok"


# ---- batching and robustness ----------------------------------------------------------------------
def record_calls(monkeypatch, extractor, delay=0.0, fail_on=None, exc=ValueError):
    calls = []
    real = extractor.extract_many
    lock = threading.Lock()

    def extract_many(docs, keys=None, **kw):
        docs = list(docs)
        with lock:
            calls.append(([d.text for d in docs], tuple(kw["schema"].names)))
        time.sleep(delay)
        if fail_on and any(fail_on in (d.text or "") for d in docs):
            raise exc(f"{fail_on} in the batch")
        return real(docs, keys, **kw)

    monkeypatch.setattr(extractor, "extract_many", extract_many)
    return calls


async def _fire(app, payloads, timeout=60):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=timeout) as c:
        return await asyncio.gather(*(c.post("/extract", json=p) for p in payloads))


def test_concurrent_requests_are_batched_and_grouped(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.05)
    app = create_app(tiny_extractor, max_batch=8, max_wait_ms=300)
    payloads = [{"text": f"Total {i}.00", "keys": ["total"] if i % 2 else ["total", "date"]} for i in range(8)]
    results = asyncio.run(_fire(app, payloads))
    assert [r.status_code for r in results] == [200] * 8
    assert [list(r.json()["fields"]) for r in results] == [p["keys"] for p in payloads]
    assert sum(len(texts) for texts, _ in calls) == 8
    assert max(len(texts) for texts, _ in calls) > 1  # one forward pass for several requests
    for texts, keys in calls:  # a call never mixes key sets
        assert all((int(t.split()[1][0]) % 2 == 1) == (keys == ("total",)) for t in texts)
    stats = app.state.batcher.stats
    assert stats["model_calls"] == len(calls) and stats["largest_call"] > 1


def test_a_failing_request_does_not_take_its_batch_down(tiny_extractor, monkeypatch):
    record_calls(monkeypatch, tiny_extractor, fail_on="boom")
    app = create_app(tiny_extractor, max_batch=8, max_wait_ms=300)
    payloads = [{"text": "Total 1.00"}, {"text": "boom"}, {"text": "Total 2.00"}, {"text": "Total 3.00"}]
    results = asyncio.run(_fire(app, payloads))
    assert [r.status_code for r in results] == [200, 422, 200, 200]
    assert "boom in the batch" in results[1].json()["detail"]
    # an unexpected exception: that request gets a JSON error, the worker lives on
    monkeypatch.undo()
    record_calls(monkeypatch, tiny_extractor, fail_on="crash", exc=RuntimeError)
    results = asyncio.run(_fire(app, [{"text": "crash"}, {"text": "Total 4.00"}]))
    assert results[0].status_code == 500 and "RuntimeError" in results[0].json()["detail"]
    assert results[1].status_code == 200


def test_timeout_and_a_responsive_loop(tiny_extractor, monkeypatch):
    record_calls(monkeypatch, tiny_extractor, delay=1.0)
    app = create_app(tiny_extractor, request_timeout_s=0.4)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            slow = asyncio.create_task(c.post("/extract", json={"text": "Total 1.00"}))
            await asyncio.sleep(0.1)  # the model is busy now
            t0 = time.perf_counter()
            health = await c.get("/health")
            health_s = time.perf_counter() - t0
            return await slow, health, health_s

    slow, health, health_s = asyncio.run(scenario())
    error(slow, 504, "timed out")
    assert health.status_code == 200 and health_s < 0.3


def test_the_app_can_be_started_again(tiny_extractor):
    app = create_app(tiny_extractor)
    for _ in range(2):  # lifespan stop shuts the worker and pools down; a new start brings them back
        with TestClient(app) as c:
            ok(c.post("/extract", json={"text": "Total 9.90"}))
