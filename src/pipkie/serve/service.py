"""One POST /extract from admission to answer: back-pressure, bounded loading, the model queue.

    request ─► draining? 503 ─► admitted < max_queue? else 503 ─► parse (4xx) ─► estimated wait ≤ deadline? else 503
            ─► load in the bounded pool (cancel event) ─► still fits? else 503 ─► Batcher ─► 200 | 4xx | 500 | 504

- Deadline: `request_timeout_s`, or the client's `X-Request-Timeout` (at most
  `max_request_timeout_s`). A request that cannot be answered within it is told so at once: 503
  `overloaded` with `Retry-After` (seconds until the backlog ahead of it should have drained).
  The estimate adds the loads ahead of it (per kind: "ocr" for images and PDFs, "parse" for
  words and text, each a running mean of measured seconds, OCR starting from `ocr_seconds`) and
  the model's queue (`Batcher.estimated_wait`, from the measured seconds per document; the
  startup warm-up call gives the first measurement), with a 20 % margin. Until a first image has
  been loaded and timed, at most `load_workers` images are admitted at once.
- While a request waits, its client is watched: a client that disconnects, a passed deadline (504)
  or a shutdown (503) withdraws its work: a queued model job is dropped, a queued load never
  starts, a running load stops at its next page (`cancel` event); nothing more is spent on it.
- Errors: the client's input gets 4xx (`parsing`, limits, a schema the model cannot fit); anything
  else is 500 `internal_error`, logged with the request id, and the worker goes on.
- Shutdown (`drain`): new requests get 503 `shutting_down`; admitted ones finish within the grace
  period, then what is left is answered 503 `shutting_down`, never dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request

from pipkie.decoding import DECODERS
from pipkie.io.document import Document
from pipkie.io.loaders import DocumentError, LoadCancelled
from pipkie.io.ocr import OCREngineError, set_engine_options
from pipkie.model.template import DocumentTooLong
from pipkie.schema import KeySchema, SchemaError
from pipkie.serve.batcher import Batcher, DeadlineExceeded, QueueFull, RunningMean, ShuttingDown
from pipkie.serve.errors import ApiError, request_id
from pipkie.serve.parsing import ExtractRequest, document_error, parse_extract, request_timeout
from pipkie.serve.render import PageImage, parse_render, render
from pipkie.serve.settings import ServeSettings
from pipkie.serve.telemetry import Metrics

log = logging.getLogger("pipkie.serve")
ADMISSION_MARGIN = 1.2  # estimates are running means: admit only what fits with this much to spare

WARMUP_TEXT = "\n".join(
    [
        "ACME TRADING SDN BHD",
        "NO 7 JALAN MAIN, 54200 KUALA LUMPUR",
        "TEL 03-1234 5678",
        "INVOICE 4711 DATE 12/03/2019 10:24",
    ]
    + [f"ITEM {i} 2 X 3.50 7.00" for i in range(24)]
    + ["SUBTOTAL 168.00", "TAX 0.00", "TOTAL RM 168.00", "CASH 200.00 CHANGE 32.00", "THANK YOU"]
)


def _client_error(e: Exception) -> ApiError | None:
    """4xx for what the model refuses because of the request (its keys, its decode), else None."""
    if isinstance(e, DocumentTooLong):
        return ApiError(422, "keys_do_not_fit", f"cannot extract: {e}")
    if isinstance(e, SchemaError):
        return ApiError(422, "invalid_keys", f"bad keys: {e}")
    if type(e).__name__ == "NoARBaseline":  # pipkie.model.modeling: AR decoding asked of a model without one
        return ApiError(422, "decode_unavailable", str(e))
    return None


class Service:
    """State of one app: settings, the extractor, the loader pool, the batcher, metrics."""

    def __init__(self, settings: ServeSettings, extractor=None):
        self.settings, self.metrics = settings, Metrics()
        if settings.ocr_min_score is not None:  # process-wide: the loader threads share the engine
            set_engine_options(settings.ocr, min_score=settings.ocr_min_score)
        self._extractor, self._lock = extractor, threading.Lock()
        self.batcher = Batcher(
            self.get_extractor,
            settings.max_batch,
            settings.max_wait_ms,
            settings.max_queue,
            on_call=self.metrics.model_call,
        )
        self.load_seconds = {"ocr": RunningMean(settings.ocr_seconds), "parse": RunningMean(0.01)}
        self.loading = {"ocr": 0, "parse": 0}
        self.load_measured = {"ocr": 0, "parse": 0}  # loads timed so far, per kind
        self.active = 0
        self.draining = False
        self._closing: asyncio.Event | None = None  # set at the end of a drain: answer what is left
        self._pool: ThreadPoolExecutor | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the running app's loop (set by start)
        self.counts = {"requests": 0, "errors": 0}
        self.metrics.bind(
            lambda: self.batcher.queued,
            lambda: sum(self.loading.values()),
            lambda: self.active,
            self.batcher.estimated_wait,
        )

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def extractor(self):
        return self._extractor

    def get_extractor(self):
        if self._extractor is None:
            with self._lock:
                if self._extractor is None:
                    from pipkie.extract import Extractor

                    s = self.settings
                    self._extractor = Extractor.from_pretrained(
                        s.model, threads=s.threads, ocr=s.ocr, compute=s.compute
                    )
        return self._extractor

    def default_keys(self) -> list[str]:
        return list(self.get_extractor().settings.keys or [])

    def pool(self) -> ThreadPoolExecutor:  # created on demand: the app can be started again after a stop
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.load_workers, thread_name_prefix="pipkie-load")
        return self._pool

    async def start(self) -> None:
        self.loop, self.draining, self._closing = asyncio.get_running_loop(), False, asyncio.Event()
        self.batcher.reopen()
        await asyncio.get_running_loop().run_in_executor(None, self.get_extractor)
        if self.settings.warmup:
            keys = self.default_keys() or ["total"]
            try:
                seconds = await self.batcher.warm_up(Document("warmup", text=WARMUP_TEXT), KeySchema.parse(keys))
                log.info("warm-up: %.2f s per document", seconds)
            except Exception:
                log.warning("warm-up call failed; estimates start from the first request", exc_info=True)

    def begin_drain(self, grace_s: float) -> None:
        """Start `drain` from a signal handler or another thread (once)."""
        if self.draining or self.loop is None:
            return
        self.draining = True
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self.drain(grace_s)))

    async def drain(self, grace_s: float) -> None:
        """SIGTERM: refuse new requests, let admitted ones finish for up to `grace_s` seconds, then
        answer the rest 503 shutting_down."""
        self.draining = True
        end = time.monotonic() + grace_s
        while self.active and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if self._closing is not None:
            self._closing.set()
        await self.batcher.stop()

    async def stop(self) -> None:
        self.draining = True
        if self._closing is not None:
            self._closing.set()
        await self.batcher.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ---- admission ------------------------------------------------------------------------------
    def estimate(self, kind: str) -> float:
        """Seconds a request of `kind` admitted now should take: the loads ahead of it, its own,
        then the model behind every queued job and every document still loading; times
        ADMISSION_MARGIN, since a late refusal (after loading) is worse than an early one."""
        ahead = sum(n * (self.load_seconds[k].upper or 0.0) for k, n in self.loading.items())
        own = self.load_seconds[kind].upper or 0.0
        coming = sum(self.loading.values())
        return ADMISSION_MARGIN * (ahead / self.settings.load_workers + own + self.batcher.estimated_wait(coming))

    def _unmeasured(self, kind: str) -> bool:
        """No image/PDF has been loaded and timed yet and the loader pool is full of them: their cost
        is a guess (`ocr_seconds`), so no more are admitted until one is measured."""
        return kind == "ocr" and self.load_measured[kind] == 0 and self.loading[kind] >= self.settings.load_workers

    def _overloaded(self, wait: float, remaining: float, why: str) -> ApiError:
        retry = max(1, math.ceil(wait - max(0.0, remaining)))
        return ApiError(
            503, "overloaded", f"the service is busy ({why}); retry after {retry} s", {"Retry-After": str(retry)}
        )

    def _shutting_down(self) -> ApiError:
        return ApiError(
            503,
            "shutting_down",
            "the service is shutting down; retry on another instance or later",
            {"Retry-After": "5"},
        )

    # ---- one request ----------------------------------------------------------------------------
    async def handle(self, request: Request) -> dict:
        """Answer one POST /extract (an Extraction as a dict), or raise ApiError."""
        t0 = time.perf_counter()
        self.counts["requests"] += 1
        try:
            result = await self._handle(request)
        except ApiError as e:  # counted by the error handler that answers it
            self.counts["errors"] += 1
            self.metrics.latency(e.status, time.perf_counter() - t0)
            raise
        self.metrics.latency(200, time.perf_counter() - t0)
        self.metrics.answered(200, "ok")
        return result

    async def _handle(self, request: Request) -> dict:
        loop = asyncio.get_running_loop()
        if self.draining:
            raise self._shutting_down()
        timeout = request_timeout(request, self.settings)
        deadline = loop.time() + timeout
        if self.active >= self.settings.max_queue:  # before reading the body: bounded memory
            raise self._overloaded(
                self.estimate("parse"), timeout, f"{self.settings.max_queue} requests are already in progress"
            )
        self.active += 1
        body_read = asyncio.Event()
        try:
            return await self._watched(request, self._run(request, deadline, body_read), deadline, timeout, body_read)
        finally:
            self.active -= 1

    async def render_page(self, request: Request) -> PageImage:
        """POST /render: one page as a PNG (`pipkie.serve.render`), drawn in the loader pool; admitted
        like an extraction (503 while draining or with max_queue requests in progress) and bounded
        by the request's deadline (504)."""
        if self.draining:
            raise self._shutting_down()
        timeout = request_timeout(request, self.settings)
        if self.active >= self.settings.max_queue:
            raise self._overloaded(
                self.estimate("parse"), timeout, f"{self.settings.max_queue} requests are already in progress"
            )
        self.active += 1
        try:
            upload = await parse_render(request, self.settings)
            job = asyncio.get_running_loop().run_in_executor(self.pool(), render, upload, self.settings)
            try:
                return await asyncio.wait_for(job, timeout)
            except TimeoutError:
                raise ApiError(504, "timeout", f"the page was not drawn within the deadline of {timeout:g} s") from None
        finally:
            self.active -= 1

    async def _run(self, request: Request, deadline: float, body_read: asyncio.Event) -> dict:
        loop = asyncio.get_running_loop()
        try:
            parsed = await parse_extract(request, self.settings, self.default_keys())
        finally:
            body_read.set()  # from here on, receive() only reports a disconnect
        if (
            DECODERS[parsed.decode].objective == "pip"
            and getattr(self.get_extractor().settings, "objective", "pip") == "ar"
        ):
            raise ApiError(422, "decode_unavailable", "this model is an AR model: ask for decode ar-free or ar-forced")
        wait, remaining = self.estimate(parsed.kind), deadline - loop.time()
        alone = (self.load_seconds[parsed.kind].value or 0.0) + (self.batcher.seconds_per_doc.value or 0.0)
        if alone > remaining:  # not even an idle service could: the deadline is the problem, not the load
            raise ApiError(
                422,
                "deadline_too_short",
                f"this request needs about {alone:.1f} s even on an idle "
                f"service, more than its deadline allows ({remaining:.1f} s left): send a longer "
                "X-Request-Timeout",
            )
        if wait > remaining:
            raise self._overloaded(wait, remaining, f"estimated {wait:.1f} s, the deadline is in {remaining:.1f} s")
        if self._unmeasured(parsed.kind):
            raise self._overloaded(wait, 0.0, "documents of this kind are being timed for the first time")
        cancel = threading.Event()
        try:
            doc = await self._load(parsed, cancel, request)
        finally:
            cancel.set()  # a load still running stops at its next page
        wait, remaining = self.batcher.estimated_wait(), deadline - loop.time()
        if self.batcher.busy and wait > remaining:  # idle: it gets its chance (504 if the deadline passes)
            raise self._overloaded(wait, remaining, "the model's queue outgrew the deadline while the document loaded")
        try:
            future = self.batcher.submit(doc, parsed.schema, parsed.decode, parsed.refine_steps, deadline)
        except QueueFull as e:
            raise self._overloaded(self.batcher.estimated_wait(), remaining, str(e)) from None
        except ShuttingDown:
            raise self._shutting_down() from None
        try:
            return (await future).to_dict()
        except DeadlineExceeded:
            raise ApiError(504, "timeout", "no answer within the request's deadline (queued for the model)") from None
        except ShuttingDown:
            raise self._shutting_down() from None
        except Exception as e:
            answer = _client_error(e)
            if answer is None:
                log.error("request %s: extraction failed", request_id(request), exc_info=e)
                raise ApiError(
                    500, "internal_error", "extraction failed; quote the request id to the operator"
                ) from None
            raise answer from None

    async def _load(self, parsed: ExtractRequest, cancel: threading.Event, request: Request) -> Document:
        kind = parsed.kind
        self.loading[kind] += 1
        t0, done = time.perf_counter(), False
        try:
            doc = await asyncio.get_running_loop().run_in_executor(self.pool(), parsed.load, cancel)
            done = True
            return doc
        except DocumentError as e:  # refused fast: not a measure of what loading costs
            raise document_error(e) from None
        except LoadCancelled:
            raise ApiError(504, "timeout", "the request was withdrawn while its document loaded") from None
        except OCREngineError as e:
            log.error("request %s: OCR engine error", request_id(request), exc_info=e)
            if e.unavailable:
                raise ApiError(
                    503,
                    "ocr_unavailable",
                    "the OCR engine is unavailable; send words or text instead",
                    {"Retry-After": "60"},
                ) from None
            raise ApiError(
                500, "internal_error", "the OCR engine failed; quote the request id to the operator"
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the loaders turn the input's faults into DocumentError; this is a decoder's
            log.warning("request %s: %s could not be read", request_id(request), parsed.name, exc_info=e)
            raise ApiError(422, "unreadable_document", f"{parsed.name}: could not read the document") from None
        finally:
            self.loading[kind] -= 1
            if done:
                self.load_seconds[kind].update(time.perf_counter() - t0)
                self.load_measured[kind] += 1

    async def _watched(self, request: Request, work, deadline: float, timeout: float, body_read: asyncio.Event) -> dict:
        """Run `work` until it ends, the client disconnects (499; watched once `body_read` is set),
        the deadline passes (504) or the service closes (503); in the last three cases `work` is
        cancelled."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        watchers = {asyncio.ensure_future(self._disconnected(request, body_read)): "gone"}
        if self._closing is not None:
            watchers[asyncio.ensure_future(self._closing.wait())] = "closing"
        try:
            done, _ = await asyncio.wait(
                {task, *watchers}, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                return task.result()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
            why = next((watchers[w] for w in done if w in watchers), "deadline")
            if why == "gone":
                log.info("request %s: client disconnected; its work was withdrawn", request_id(request))
                raise ApiError(499, "client_closed_request", "the client closed the connection")
            if why == "closing":
                raise self._shutting_down()
            raise ApiError(504, "timeout", f"no answer within the request's deadline of {timeout:g} s")
        finally:
            for w in watchers:
                w.cancel()

    @staticmethod
    async def _disconnected(request: Request, body_read: asyncio.Event) -> None:
        """Returns when the client disconnects: once the body is read, an ASGI server answers
        receive() only with http.disconnect (when the client goes, or after the response)."""
        await body_read.wait()
        for _ in range(100):  # a server that keeps sending empty bodies is not watched (no busy loop)
            message = await request.receive()
            if message.get("type") == "http.disconnect":
                return
        await asyncio.Event().wait()  # until cancelled
