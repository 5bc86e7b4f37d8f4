"""The service: uploads and JSON, every bad input answered 4xx in the error format, dynamic batching,
failures confined to their request (500 for the server's own), request ids, a responsive loop,
settings from the environment, the CLI's serve command.

Limits are in test_serve_limits.py; back-pressure, cancellation, shutdown and /metrics in
test_serve_load.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from pipkie.serve import ServeSettings, create_app
from tests.test_extract import (  # noqa: F401
    BOX_FILE,
    KEYS,
    SAMPLE,
    answering,
    check_extraction,
    needs_sroie,
    receipt_doc,
    tiny_extractor,
    tiny_model_dir,
)
from tests.test_loaders import make_text_pdf

WORDS = {
    "words": [
        {"text": "ACME", "box": [100, 50, 300, 80]},
        {"text": "TOTAL", "box": [100, 800, 200, 820]},
        {"text": "9.90", "box": [700, 800, 780, 820]},
    ]
}


@pytest.fixture
def client(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_upload_mb=1, max_pages=2, max_keys=8)) as c:
        yield c


def ok(res, keys=KEYS):
    assert res.status_code == 200, res.text
    assert res.headers["x-request-id"]
    return check_extraction(_as_extraction(res.json()), keys, res.json()["decode"])


def _as_extraction(d):
    from pipkie.extract import Box, Extraction, Field

    fields = {k: Field(**{**f, "boxes": [Box(**b) for b in f["boxes"]]}) for k, f in d["fields"].items()}
    return Extraction(**{**d, "fields": fields})


def error(res, status: int, code: str, *fragments: str) -> str:
    """The error format: status, stable code, a message, the request id in body and header."""
    assert res.status_code == status, (res.status_code, res.text)
    body = res.json()
    assert set(body) == {"code", "detail", "request_id"} and body["code"] == code, body
    assert body["request_id"] == res.headers["x-request-id"] and len(body["request_id"]) >= 8
    assert isinstance(body["detail"], str) and body["detail"]
    for f in fragments:
        assert f in body["detail"], body["detail"]
    return body["detail"]


# ---- the happy paths ------------------------------------------------------------------------------
def test_health_and_docs(client, tiny_extractor):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "pipkie-tiny-model" and h["keys"] == KEYS
    assert h["limits"]["max_keys"] == 8 and h["limits"]["max_words"] == 10_000 and "queued" in h["batching"]
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths) == {"/health", "/metrics", "/extract", "/render"}
    assert set(paths["/extract"]["post"]["requestBody"]["content"]) == {"multipart/form-data", "application/json"}


def test_the_documented_key_patterns_admit_what_the_service_takes(client):
    """/openapi.json's patterns for `keys` (a list, or one comma-separated string) admit typed keys,
    `:text` and lists, and refuse what the service refuses (an unknown type, an open bracket)."""
    import re

    content = client.get("/openapi.json").json()["paths"]["/extract"]["post"]["requestBody"]["content"]
    body = content["application/json"]["schema"]["properties"]["keys"]
    one, many = body["anyOf"][0]["items"]["pattern"], body["anyOf"][1]["pattern"]
    assert content["multipart/form-data"]["schema"]["properties"]["keys"]["pattern"] == many
    for k in ("total", "date:date", "note : text", "store name", "items[name, price:money!]"):
        assert re.match(one, k) and re.match(many, k), k
    assert re.match(many, "company,date:date, items[name,price:money!]")
    for bad in ("date:when", "items[name", ""):
        assert not re.match(one, bad) and not re.match(many, bad), bad
        assert client.post("/extract", json={"text": "Total 9.90", "keys": bad or ","}).status_code == 422


def test_multipart_real_receipt_image(client, receipt_doc):  # receipt_doc: the OCR engine is warm
    with open(SAMPLE, "rb") as f:
        res = client.post(
            "/extract",
            files={"file": ("receipt.jpg", f, "image/jpeg")},
            data={"keys": "company,total", "decode": "pip"},
        )
    d = ok(res, ["company", "total"])
    assert d["document"] == "receipt"


def test_multipart_pdf_text_and_schema(client):
    pdf = make_text_pdf([[(72, 720, 14, "ACME TRADING"), (72, 300, 12, "TOTAL 9.90")]])
    ok(client.post("/extract", files={"file": ("inv.pdf", pdf, "application/pdf")}))
    ok(
        client.post("/extract", files={"file": ("note.txt", b"Total 9.90", "text/plain")}, data={"keys": "total"}),
        ["total"],
    )
    schema = {
        "type": "object",
        "properties": {"total": {"type": "string", "maxLength": 12}, "vendor": {"type": "string"}},
    }
    ok(
        client.post(
            "/extract", files={"file": ("note.txt", b"Total 9.90", "text/plain")}, data={"schema": json.dumps(schema)}
        ),
        ["total", "vendor"],
    )


def test_json_words_and_text(client, tiny_extractor):
    d = ok(client.post("/extract", json={**WORDS, "keys": ["total"], "id": "w1"}), ["total"])
    assert d["document"] == "w1"
    ok(
        client.post("/extract", json={"text": "Total 9.90", "keys": "company,total", "decode": "ar-forced"}),
        ["company", "total"],
    )
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
    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", answering({"total": "85.54"}))
    d = ok(client.post("/extract", json={"words": words, "page_sizes": [[664, 1664]], "id": BOX_FILE.stem}))
    assert d["fields"]["total"]["grounding"] == "exact" and d["fields"]["total"]["boxes"]


def test_request_ids(client):
    mine = client.post("/extract", json={"text": "Total 9.90"}, headers={"X-Request-ID": "client-42"})
    assert mine.status_code == 200 and mine.headers["x-request-id"] == "client-42"
    hostile = client.post("/extract", json={"text": ""}, headers={"X-Request-ID": "x" * 500 + "\n"})
    rid = hostile.json()["request_id"]
    assert rid == hostile.headers["x-request-id"] and len(rid) == 16 and rid.isalnum()
    other = client.post("/extract", json={"text": ""}).json()["request_id"]
    assert other != rid


# ---- bad inputs: 4xx, a stable code and a message -----------------------------------------------
def test_bad_keys(client):
    post = lambda **data: client.post("/extract", files={"file": ("n.txt", b"Total 9.90", "text/plain")}, data=data)  # noqa: E731
    error(post(keys=" , "), 422, "invalid_keys", "keys is empty")
    error(client.post("/extract", json={"text": "x", "keys": []}), 422, "invalid_keys", "keys is empty")
    error(post(keys=",".join(f"k{i}" for i in range(9))), 422, "invalid_keys", "9 keys", "at most 8")
    error(post(keys="a" * 65), 422, "invalid_keys", "65 characters")
    error(post(keys="to;tal"), 422, "invalid_keys", "characters other than")
    error(post(keys="to:tal"), 422, "invalid_keys", "unknown value type 'tal'", "date, time, money, phone")
    error(post(keys="total,total"), 422, "invalid_keys", "twice")
    error(post(keys="total", schema="{}"), 422, "invalid_keys", "not both")
    error(post(schema="{not json"), 422, "invalid_keys", "not valid JSON")
    error(post(schema=json.dumps({"properties": {"n": {"type": "integer"}}})), 422, "invalid_keys", "must be a string")
    error(post(schema=json.dumps({"properties": {"n": "string"}})), 422, "invalid_keys", "must be an object")
    error(post(schema=json.dumps({"properties": {"n": {"type": [{}]}}})), 422, "invalid_keys", "list of strings")
    error(post(schema=json.dumps({"properties": {"n": {"anyOf": [1]}}})), 422, "invalid_keys", "anyOf")
    error(post(keys="total", decode="beam"), 422, "invalid_request", "decode must be one of")
    error(post(keys="total", refine_steps="99"), 422, "invalid_request", "refine_steps")
    error(client.post("/extract", json={"text": "x", "refine_steps": 1.5}), 422, "invalid_request", "refine_steps")
    error(post(keys="total", key="oops"), 422, "invalid_request", "unknown form fields")
    # keys whose mask budgets leave no room for the document: refused by the model worker, as a 422
    big = {"type": "object", "properties": {f"k{i}": {"type": "string", "x-max-tokens": 256} for i in range(5)}}
    error(post(schema=json.dumps(big)), 422, "keys_do_not_fit", "cannot extract")


def test_bad_content(client):
    error(
        client.post("/extract", content=b"<xml/>", headers={"content-type": "text/xml"}),
        415,
        "unsupported_media_type",
        "content type",
    )
    error(
        client.post("/extract", files={"file": ("a.zip", b"PK\x03\x04", "application/zip")}),
        415,
        "unsupported_media_type",
        "application/zip",
    )
    error(
        client.post("/extract", files={"file": ("a.bin", b"\x00\x01\x02\xff\xfe", "application/octet-stream")}),
        415,
        "unsupported_type",
        "unsupported",
    )
    error(
        client.post("/extract", files={"file": ("r.jpg", b"\xff\xd8\xff\xe0 truncated jpeg", "image/jpeg")}),
        422,
        "unreadable_document",
        "r.jpg",
    )
    detail = error(
        client.post("/extract", files={"file": ("r.png", b"garbage", "image/png")}),
        422,
        "unreadable_document",
        "not a readable image",
    )
    assert "corrupt image data" not in detail  # the decoder's words stay in the log
    error(
        client.post("/extract", content=b'{"text": ', headers={"content-type": "application/json"}),
        400,
        "malformed_body",
        "malformed JSON",
    )
    error(
        client.post("/extract", content=b"[" * 100_000, headers={"content-type": "application/json"}),
        400,
        "malformed_body",
    )
    error(
        client.post("/extract", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data"}),
        400,
        "malformed_body",
        "malformed multipart",
    )
    error(
        client.post("/extract", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data; boundary=x"}),
        422,
        "invalid_request",
        "no document",
    )
    error(client.post("/extract", json=[1, 2]), 422, "invalid_request", "object")
    error(client.post("/extract", json={"keys": ["total"]}), 422, "invalid_request", "no document")
    error(client.post("/extract", json={"text": "a", "words": []}), 422, "invalid_request", "not both")
    error(client.post("/extract", json={"words": []}), 422, "empty_document", "no words")
    error(client.post("/extract", json={"words": [{"text": "x", "box": [1, 2]}]}), 422, "invalid_words", "box must be")
    error(
        client.post(
            "/extract",
            content=b'{"words": [{"text": "x", "box": [NaN, 0, 1, 1]}]}',
            headers={"content-type": "application/json"},
        ),
        422,
        "invalid_words",
        "box must be",
    )
    error(
        client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 5000, 10]}]}),
        422,
        "invalid_words",
        "0-1000",
    )
    error(
        client.post("/extract", json={"words": [{"text": "x", "box": [0, 0, 1, 1]}], "page_sizes": "a4"}),
        422,
        "invalid_words",
        "page_sizes",
    )
    error(client.post("/extract", json={**WORDS, "colour": 1}), 422, "invalid_request", "unknown fields")
    error(client.post("/extract", json={**WORDS, "id": {"a": 1}}), 422, "invalid_request", "id must be")
    error(
        client.post("/extract", data={"keys": "total"}, files={"other": ("x", b"1")}),
        422,
        "invalid_request",
        "unknown form fields",
    )
    error(
        client.post("/extract", headers={"X-Request-Timeout": "soon"}, json={"text": "x"}),
        422,
        "invalid_request",
        "X-Request-Timeout",
    )
    error(client.get("/nowhere"), 404, "not_found")
    error(client.get("/extract"), 405, "method_not_allowed")
    assert client.get("/health").json()["status"] == "ok"


def test_a_decoder_library_crash_is_the_documents_fault(client, monkeypatch):
    """A malformed file that makes a decoder library raise something unexpected: 422, its text only logged."""
    import struct

    def broken(*a, **kw):
        raise struct.error("unpack requires a buffer of 4 bytes")

    monkeypatch.setattr("pipkie.serve.parsing.load_document", broken)
    detail = error(
        client.post("/extract", files={"file": ("r.png", b"\x89PNG\r\n\x1a\n....", "image/png")}),
        422,
        "unreadable_document",
        "r.png",
        "could not read",
    )
    assert "unpack" not in detail
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


async def fire(app, payloads, timeout=60, headers=None):
    """POST every payload at once through the ASGI app (no lifespan: nothing is warmed up)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=timeout) as c:
        return await asyncio.gather(*(c.post("/extract", json=p, headers=headers) for p in payloads))


def test_concurrent_requests_are_batched_and_grouped(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.05)
    app = create_app(tiny_extractor, max_batch=8, max_wait_ms=300)
    payloads = [{"text": f"Total {i}.00", "keys": ["total"] if i % 2 else ["total", "date"]} for i in range(8)]
    results = asyncio.run(fire(app, payloads))
    assert [r.status_code for r in results] == [200] * 8
    assert [list(r.json()["fields"]) for r in results] == [p["keys"] for p in payloads]
    assert sum(len(texts) for texts, _ in calls) == 8
    assert max(len(texts) for texts, _ in calls) > 1  # one forward pass for several requests
    for texts, keys in calls:  # a call never mixes key sets
        assert all((int(t.split()[1][0]) % 2 == 1) == (keys == ("total",)) for t in texts)
    stats = app.state.service.batcher.stats
    assert stats["model_calls"] == len(calls) and stats["largest_call"] > 1


def test_a_failing_request_does_not_take_its_batch_down(tiny_extractor, monkeypatch, caplog):
    record_calls(monkeypatch, tiny_extractor, fail_on="boom", exc=RuntimeError)
    app = create_app(tiny_extractor, max_batch=8, max_wait_ms=300)
    payloads = [{"text": "Total 1.00"}, {"text": "boom"}, {"text": "Total 2.00"}, {"text": "Total 3.00"}]
    with caplog.at_level("ERROR", logger="pipkie.serve"):
        results = asyncio.run(fire(app, payloads))
    assert [r.status_code for r in results] == [200, 500, 200, 200]
    detail = error(results[1], 500, "internal_error", "request id")
    assert "boom" not in detail and "RuntimeError" not in detail  # the server's failure: details in the log only
    assert results[1].json()["request_id"] in caplog.text and "boom in the batch" in caplog.text
    # a ValueError inside the model code is a server bug too, not the client's fault; the worker lives on
    monkeypatch.undo()
    record_calls(monkeypatch, tiny_extractor, fail_on="crash", exc=ValueError)
    results = asyncio.run(fire(app, [{"text": "crash"}, {"text": "Total 4.00"}]))
    assert [r.status_code for r in results] == [500, 200]


def test_timeout_and_a_responsive_loop(tiny_extractor, monkeypatch):
    record_calls(monkeypatch, tiny_extractor, delay=1.0)
    app = create_app(tiny_extractor, request_timeout_s=0.4)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            slow = asyncio.create_task(c.post("/extract", json={"text": "Total 1.00"}))
            await asyncio.sleep(0.1)  # the model is busy now
            health = await c.get("/health")
            busy = not slow.done()  # answered while the extraction still runs
            return await slow, health, busy

    slow, health, busy = asyncio.run(scenario())
    error(slow, 504, "timeout", "deadline")
    assert health.status_code == 200 and busy


def test_the_app_can_be_started_again(tiny_extractor):
    app = create_app(tiny_extractor)
    for _ in range(2):  # lifespan stop shuts the worker and pools down; a new start brings them back
        with TestClient(app) as c:
            ok(c.post("/extract", json={"text": "Total 9.90"}))


# ---- settings and the CLI -------------------------------------------------------------------------
def test_settings_from_the_environment_and_overrides():
    s = ServeSettings.from_env(
        {"PIPKIE_MAX_WORDS": "123", "PIPKIE_WARMUP": "false", "PIPKIE_MAX_BATCH": "4"}, max_batch=2, max_pages=None
    )
    assert (s.max_words, s.warmup, s.max_batch, s.max_pages) == (123, False, 2, 10)
    assert ServeSettings().max_pixels == 40_000_000 and ServeSettings().request_timeout_s == 15
    with pytest.raises(ValueError, match="PIPKIE_MAX_PIXELS"):
        ServeSettings.from_env({"PIPKIE_MAX_PIXELS": "lots"})
    with pytest.raises(ValueError, match="max_keys"):
        ServeSettings.from_env({}, max_keys=0)
    with pytest.raises(ValueError, match="unknown serve settings"):
        ServeSettings.from_env({}, colour="red")
    app = create_app(object(), ServeSettings(max_words=7), max_queue=3)
    assert (app.state.service.settings.max_words, app.state.service.settings.max_queue) == (7, 3)


def test_settings_ocr_min_score_reaches_the_engine(monkeypatch):
    """PIPKIE_OCR_MIN_SCORE / --ocr-min-score: checked, kept out of /health, set on the engine."""
    from pipkie.io import ocr

    monkeypatch.setattr(ocr, "_OPTIONS", {})  # process-wide: kept out of other tests
    s = ServeSettings.from_env({"PIPKIE_OCR_MIN_SCORE": "0.5"})
    assert s.ocr_min_score == 0.5 and "ocr_min_score" not in s.public()
    with pytest.raises(ValueError, match="PIPKIE_OCR_MIN_SCORE"):
        ServeSettings.from_env({"PIPKIE_OCR_MIN_SCORE": "1.5"})
    with pytest.raises(ValueError, match="only rapidocr takes a line-score threshold"):
        ServeSettings.from_env({}, ocr="tesseract", ocr_min_score=0.5)
    create_app(object(), ServeSettings())
    assert ocr._OPTIONS == {}  # unset: the engine's own default
    create_app(object(), s)
    assert ocr._OPTIONS == {"rapidocr": {"min_score": 0.5}}
    assert ocr.get_engine("rapidocr", threads=1).min_score == 0.5
    ocr._cached_engine.cache_clear()


def test_cli_serve_builds_settings_from_options_and_env(tiny_model_dir, monkeypatch):
    from typer.testing import CliRunner

    import pipkie.serve
    from pipkie.cli import app

    seen = {}
    monkeypatch.setattr(
        pipkie.serve,
        "run",
        lambda host, port, extractor, settings: seen.update(
            host=host, port=port, name=extractor.name, settings=settings
        ),
    )
    monkeypatch.setenv("PIPKIE_MAX_WORDS", "500")
    res = CliRunner().invoke(
        app, ["serve", "--model", str(tiny_model_dir), "--port", "8123", "--timeout", "5", "--max-pixels", "1000000"]
    )
    assert res.exit_code == 0, res.output
    s = seen["settings"]
    assert seen["port"] == 8123 and (s.request_timeout_s, s.max_pixels, s.max_words) == (5, 1_000_000, 500)
    monkeypatch.setenv("PIPKIE_MAX_QUEUE", "none")
    res = CliRunner().invoke(app, ["serve", "--model", str(tiny_model_dir)])
    assert res.exit_code == 2 and "PIPKIE_MAX_QUEUE" in res.output
