"""Back-pressure, cancellation, graceful shutdown and /metrics (a stub-slowed tiny model).

The model is made slow on purpose (`record_calls(delay=...)`), so the tests can fill its queue on a
2-core machine. The tests assert what happened and in which order (a refused request never reached
the model, a 200 is no 504), not stopwatch readings: those are `scripts/load_test.py`'s job.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from pipkie.io.document import Document
from pipkie.schema import KeySchema
from pipkie.serve import create_app, drain_on_signals
from pipkie.serve.batcher import Batcher, RunningMean, ShuttingDown
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401
from tests.test_serve import error, record_calls
from tests.test_serve_limits import load_test  # noqa: F401


async def posts(app, payloads, headers=None, lifespan=True, gap=0.0):
    """POST every payload concurrently (`gap` s apart); the responses, in the payloads' order.
    `lifespan` runs the app's startup (the warm-up call that measures the model) and shutdown."""

    async def one(c, p, delay):
        await asyncio.sleep(delay)
        return await c.post("/extract", json=p, headers=headers)

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
            return await asyncio.gather(*(one(c, p, i * gap) for i, p in enumerate(payloads)))

    if not lifespan:
        return await go()
    async with app.router.lifespan_context(app):
        return await go()


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample of a Prometheus text exposition (KeyError if absent)."""
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return samples[(name, tuple(sorted(labels.items())))]


def texts_run(calls) -> list[str]:
    return [t for texts, _ in calls for t in texts]


def test_overload_is_refused_at_once_and_the_rest_meet_their_deadline(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.3)
    app = create_app(tiny_extractor, max_batch=1, max_wait_ms=0)
    payloads = [{"text": f"Total {i}.00"} for i in range(10)]
    results = asyncio.run(posts(app, payloads, headers={"X-Request-Timeout": "1.5"}))
    served = [p["text"] for p, r in zip(payloads, results) if r.status_code == 200]
    refused = [(p["text"], r) for p, r in zip(payloads, results) if r.status_code == 503]
    assert len(served) + len(refused) == 10  # nothing else: no 504 (a deadline missed), no 500
    assert served and refused
    ran = texts_run(calls)
    assert all(text in ran for text in served)
    for text, r in refused:
        error(r, 503, "overloaded", "busy")
        assert int(r.headers["retry-after"]) >= 1
        assert text not in ran  # refused up front, not after waiting its turn


def test_a_deadline_no_idle_service_could_meet_is_the_clients(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.5)
    app = create_app(tiny_extractor, min_request_timeout_s=0.1)
    (res,) = asyncio.run(posts(app, [{"text": "Total 1.00"}], headers={"X-Request-Timeout": "0.2"}))
    error(res, 422, "deadline_too_short", "idle", "X-Request-Timeout")
    assert calls and "Total 1.00" not in texts_run(calls)  # the warm-up ran; the refused request never did
    with TestClient(create_app(tiny_extractor)) as c:  # below the least deadline a client may ask for
        error(
            c.post("/extract", json={"text": "x"}, headers={"X-Request-Timeout": "0.5"}),
            422,
            "invalid_request",
            "from 1 to 300",
        )


def test_until_an_image_is_timed_only_the_loader_threads_take_images(tiny_extractor, monkeypatch):
    """The OCR cost is a guess (ocr_seconds) until one image is timed: the first burst of uploads
    gets `load_workers` admissions, the rest an immediate 503, not a late one. The OCR is held
    until the refusals have arrived, so "immediate" is an order of events, not a stopwatch."""
    import io

    from PIL import Image

    import pipkie.io.loaders as loaders
    from pipkie.io.ocr import OCRWord

    release, ocr_calls = threading.Event(), []

    def held_ocr(image):
        ocr_calls.append(image.size)
        assert release.wait(30), "the test never released the OCR"
        return [OCRWord("TOTAL", (0, 0, 10, 10), 0.9)]

    monkeypatch.setattr(loaders, "get_engine", lambda name="rapidocr", threads=1: held_ocr)
    buf = io.BytesIO()
    Image.new("L", (60, 40), 255).save(buf, "PNG")
    app = create_app(tiny_extractor, load_workers=2)

    async def scenario():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
                broken = await c.post("/extract", files={"file": ("b.png", b"\x89PNG\r\n\x1a\n?", "image/png")})
                assert broken.status_code == 422  # refused at once: that is no measure of the OCR's cost
                uploads = [
                    asyncio.ensure_future(c.post("/extract", files={"file": ("r.png", buf.getvalue(), "image/png")}))
                    for _ in range(5)
                ]
                refused = []
                while len(refused) < 3:  # while every OCR is still held
                    done, _ = await asyncio.wait(
                        [u for u in uploads if u not in refused], timeout=20, return_when=asyncio.FIRST_COMPLETED
                    )
                    assert done, "the surplus uploads were not refused while the OCR was busy"
                    refused += done
                refusals = [u.result() for u in refused]
                release.set()
                return refusals, await asyncio.gather(*uploads)

    refusals, results = asyncio.run(scenario())
    for r in refusals:
        error(r, 503, "overloaded", "timed for the first time")
    assert sorted(r.status_code for r in results) == [200, 200, 503, 503, 503]
    assert len(ocr_calls) == 2  # only the admitted uploads reached the OCR


def test_the_queue_is_bounded(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.5)
    app = create_app(tiny_extractor, max_batch=1, max_queue=2, warmup=False)
    payloads = [{"text": f"Total {i}.00"} for i in range(4)]
    results = asyncio.run(posts(app, payloads, gap=0.02, headers={"X-Request-Timeout": "30"}))
    assert sorted(r.status_code for r in results) == [200, 200, 503, 503]
    for p, r in zip(payloads, results):
        if r.status_code == 503:
            error(r, 503, "overloaded", "2 requests are already in progress")
            assert p["text"] not in texts_run(calls)


def test_a_request_past_its_deadline_is_never_run(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.6)
    app = create_app(tiny_extractor, max_batch=1, warmup=False, min_request_timeout_s=0.1)  # nothing measured

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            first = asyncio.create_task(c.post("/extract", json={"text": "first"}))
            await asyncio.sleep(0.1)
            late = await c.post("/extract", json={"text": "late"}, headers={"X-Request-Timeout": "0.2"})
            await first
            await asyncio.sleep(0.8)  # the worker has moved on past the late job
            return late

    late = asyncio.run(scenario())
    error(late, 504, "timeout", "0.2 s")
    assert texts_run(calls) == ["first"]


def test_a_withdrawn_load_never_starts(tiny_extractor, monkeypatch):
    import pipkie.serve.parsing as parsing

    started = []
    real = parsing.words_document

    def slow_words(obj, *a, **kw):
        if obj["words"]:  # not the cheap page_sizes check made while parsing
            started.append(obj["id"])
            time.sleep(0.5 if obj["id"] == "slow" else 0)
        return real(obj, *a, **kw)

    monkeypatch.setattr(parsing, "words_document", slow_words)
    app = create_app(tiny_extractor, load_workers=1, warmup=False, min_request_timeout_s=0.1)
    words = [{"text": "TOTAL", "box": [1, 1, 9, 9]}]

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            slow = asyncio.create_task(c.post("/extract", json={"id": "slow", "words": words}))
            await asyncio.sleep(0.1)
            withdrawn = await c.post("/extract", json={"id": "b", "words": words}, headers={"X-Request-Timeout": "0.2"})
            slow = await slow
            await asyncio.sleep(0.3)
            return slow, withdrawn

    slow, withdrawn = asyncio.run(scenario())
    assert slow.status_code == 200
    error(withdrawn, 504, "timeout")
    assert started == ["slow"]  # the withdrawn load was cancelled in the pool's queue


def test_a_client_that_leaves_withdraws_its_work(tiny_extractor, monkeypatch):
    calls = record_calls(monkeypatch, tiny_extractor, delay=0.5)
    app = create_app(tiny_extractor, max_batch=1, warmup=False)
    body = b'{"text": "abandoned"}'

    async def leaving_client():
        """Sends its body, then hangs up 0.2 s later (receive() answers http.disconnect)."""
        sent, messages = False, []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(0.2)
            return {"type": "http.disconnect"}

        async def send(message):
            messages.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/extract",
            "raw_path": b"/extract",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }
        await app(scope, receive, send)
        return messages

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            busy = asyncio.create_task(c.post("/extract", json={"text": "busy"}))
            await asyncio.sleep(0.1)
            messages = await leaving_client()
            await busy
            await asyncio.sleep(0.7)
            return messages, (await c.get("/metrics")).text

    messages, metrics = asyncio.run(scenario())
    assert messages[0]["status"] == 499
    assert texts_run(calls) == ["busy"]  # the abandoned document never reached the model
    assert metric(metrics, "pipkie_rejections_total", reason="client_closed_request") == 1


def test_metrics_in_prometheus_format(tiny_extractor):
    with TestClient(create_app(tiny_extractor, max_words=5)) as c:
        for _ in range(3):
            assert c.post("/extract", json={"text": "Total 9.90"}).status_code == 200
        assert c.post("/extract", json={"text": "a b c d e f"}).status_code == 413
        assert c.get("/nowhere").status_code == 404
        res = c.get("/metrics")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    m = lambda name, **labels: metric(res.text, name, **labels)  # noqa: E731
    assert m("pipkie_responses_total", code="ok", status="200") == 3
    assert m("pipkie_responses_total", code="too_many_words", status="413") == 1
    assert m("pipkie_rejections_total", reason="too_many_words") == 1
    assert m("pipkie_responses_total", code="not_found", status="404") == 1
    assert m("pipkie_batch_size_count") == 3  # the warm-up call is not a batch
    assert m("pipkie_request_seconds_count", status="200") == 3
    assert m("pipkie_request_seconds_count", status="413") == 1
    assert m("pipkie_queue_depth") == 0 and m("pipkie_estimated_wait_seconds") > 0  # measured by the warm-up
    assert m("process_resident_memory_bytes") > 0


def test_stopping_the_batcher_answers_every_queued_job():
    async def scenario():
        gate = threading.Event()

        class Stuck:
            def extract_many(self, docs, **kw):
                gate.wait(5)
                return [None] * len(docs)

        b = Batcher(lambda: Stuck(), max_batch=1, max_wait_ms=0)
        schema = KeySchema.parse(["total"])
        futures = [b.submit(Document(str(i), text="x"), schema, "pip", 0) for i in range(3)]
        await asyncio.sleep(0.1)  # the first is running, two are queued
        await b.stop()
        gate.set()
        with pytest.raises(ShuttingDown):
            b.submit(Document("late", text="x"), schema, "pip", 0)
        return [f.exception() if f.done() and not f.cancelled() else "not answered" for f in futures]

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, ShuttingDown) for o in outcomes), outcomes


def test_admission_plans_with_the_spread_of_call_times_not_their_mean():
    """Steady call times: the planning figure is the mean. Times that swing (a busy neighbour on the
    cores): it covers the slow calls, so a request is refused at once instead of answered late."""
    steady, swinging = RunningMean(), RunningMean()
    for i in range(40):
        steady.update(2.0)
        swinging.update(1.0 if i % 2 else 3.0)
    assert steady.upper == pytest.approx(2.0)
    assert 1.5 < swinging.value < 2.5 and swinging.upper >= 3.0


def test_the_wait_estimate_counts_whole_model_calls():
    """A job's answer comes when its call ends, and on a busy service later jobs fill its call: with
    4 documents per call, a fifth job waits for two full calls, not five documents."""

    async def scenario():
        gate = threading.Event()

        class Stuck:
            def extract_many(self, docs, **kw):
                gate.wait(5)
                return [None] * len(docs)

        b = Batcher(lambda: Stuck(), max_batch=4, max_wait_ms=0)
        b.seconds_per_doc.update(1.0)
        idle = b.estimated_wait()
        schema = KeySchema.parse(["total"])
        futures = [b.submit(Document(str(i), text="x"), schema, "pip", 0) for i in range(8)]
        await asyncio.sleep(0.1)  # a call of 4 runs, 4 are queued
        busy = b.estimated_wait()
        gate.set()
        await asyncio.gather(*futures)
        await b.stop()
        return idle, busy

    idle, busy = asyncio.run(scenario())
    assert idle == pytest.approx(1.0)
    # the running call (≈4 s left) + two calls of 4 (the queued 4, then this job's, filled by later ones)
    assert busy == pytest.approx(4 + 8, abs=0.2)


def serve_in_thread(app):
    """A real uvicorn server on a free port, in a daemon thread: (server, thread, port)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(400):
        if server.started:
            break
        time.sleep(0.05)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


def test_the_load_script_checks_the_contract(tiny_extractor, monkeypatch, load_test):
    """scripts/load_test.py against a real server: every request a success within its deadline
    or a 503 within 1 s, and the summary counts them so."""
    record_calls(monkeypatch, tiny_extractor, delay=0.4)
    app = create_app(tiny_extractor, max_batch=1, max_wait_ms=0, request_timeout_s=1.0)
    server, thread, port = serve_in_thread(app)
    args = argparse.Namespace(
        documents=4,
        payload="words",
        keys=None,
        clients=6,
        requests=3,
        request_timeout=1.0,
        deadline=60,
        honour_retry_after=False,
    )
    try:
        summary = asyncio.run(load_test.run_load(f"http://127.0.0.1:{port}", args))
    finally:
        server.should_exit = True
        thread.join(30)
    assert summary["requests"] == 18 == summary["succeeded"] + summary["rejected_503"]
    assert summary["succeeded"] > 0 and summary["rejected_503"] > 0
    assert summary["violations"] == {"success_after_deadline": 0, "rejection_after_1s": 0, "other_failures": 0}
    assert summary["latency_ms"]["p99"] <= 1000 and summary["rejection_latency_ms"]["max"] <= 1000


def test_the_load_summary_counts_violations(load_test):
    results = [(200, 0.5, None), (200, 2.5, None), (503, 0.01, "busy"), (503, 1.5, "busy"), ("ReadTimeout", 9.0, "t")]
    summary = load_test.summarize(results, total=6, wall=10.0, deadline_s=2.0)
    assert (summary["succeeded"], summary["rejected_503"]) == (2, 2)
    assert summary["failures"] == {"ReadTimeout": 1} and summary["not_sent"] == 1  # (a --deadline run)
    assert summary["violations"] == {"success_after_deadline": 1, "rejection_after_1s": 1, "other_failures": 1}
    assert summary["goodput_per_s"] == 0.2 and summary["latency_ms"]["max"] == 2500.0


def test_sigterm_finishes_or_rejects_every_request(tiny_extractor, monkeypatch):
    """A real uvicorn server, SIGTERM while requests are queued: each gets 200 or 503 shutting_down.

    The server runs in a thread (uvicorn installs no signal handlers there), so this test installs
    what uvicorn installs in the main thread (its handle_exit) and the app's drain chained before it.
    """
    record_calls(monkeypatch, tiny_extractor, delay=0.4)
    app = create_app(tiny_extractor, max_batch=1, warmup=False)
    server, thread, port = serve_in_thread(app)
    original = signal.signal(signal.SIGTERM, server.handle_exit)
    restore = drain_on_signals(app.state.service, grace_s=1.0)
    results: list = []

    def client(i):
        try:
            results.append(
                httpx.post(
                    f"http://127.0.0.1:{port}/extract",
                    json={"text": f"Total {i}"},
                    headers={"X-Request-Timeout": "30"},
                    timeout=30,
                )
            )
        except httpx.HTTPError as e:
            results.append(e)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    try:
        for t in clients:
            t.start()
        time.sleep(0.3)  # the model is busy, the others are queued
        signal.raise_signal(signal.SIGTERM)
        for t in clients:
            t.join(30)
        thread.join(30)
    finally:
        restore()
        signal.signal(signal.SIGTERM, original)
    assert not thread.is_alive() and len(results) == 6
    assert all(isinstance(r, httpx.Response) for r in results), results  # nothing dropped
    statuses = sorted(r.status_code for r in results)
    assert statuses[0] == 200 and statuses[-1] == 503  # the running ones finished, the rest were told
    for r in results:
        if r.status_code == 503:
            error(r, 503, "shutting_down")
        else:
            assert r.status_code == 200
