"""Prometheus metrics of one service instance (GET /metrics, text exposition format).

Each app has its own registry (two apps in one process, as in tests, do not share counters):

- `pipkie_queue_depth`: jobs waiting for the model; `pipkie_loading`: documents being loaded or
  OCR'd; `pipkie_active_requests`: requests admitted and not answered yet;
  `pipkie_estimated_wait_seconds`: what a request arriving now would wait for the model;
- `pipkie_batch_size` (histogram): documents per model call; `pipkie_model_call_seconds`;
  `pipkie_model_call_failures_total`;
- `pipkie_request_seconds` (histogram, by status): POST /extract latency;
- `pipkie_responses_total` (by status and code); `pipkie_rejections_total` (by reason: overloaded,
  shutting_down, timeout, client_closed_request, and the 413 limits);
- `process_*` (resident memory, CPU seconds, open files): what a soak watches for leaks.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

REJECTIONS = {
    "overloaded",
    "shutting_down",
    "timeout",
    "client_closed_request",
    "body_too_large",
    "too_many_pages",
    "too_many_pixels",
    "too_many_words",
}


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.queue_depth = Gauge("pipkie_queue_depth", "jobs waiting for the model", registry=r)
        self.loading = Gauge("pipkie_loading", "documents being loaded or OCR'd", registry=r)
        self.active = Gauge("pipkie_active_requests", "requests admitted and not answered yet", registry=r)
        self.estimated_wait = Gauge("pipkie_estimated_wait_seconds", "model wait of a request arriving now", registry=r)
        self.batch_size = Histogram(
            "pipkie_batch_size", "documents per model call", registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128)
        )
        self.call_seconds = Histogram(
            "pipkie_model_call_seconds",
            "seconds per model call",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
        )
        self.call_failures = Counter("pipkie_model_call_failures", "model calls that raised", registry=r)
        self.request_seconds = Histogram(
            "pipkie_request_seconds",
            "POST /extract latency",
            ["status"],
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300),
        )
        self.responses = Counter("pipkie_responses", "answers by status and code", ["status", "code"], registry=r)
        self.rejections = Counter(
            "pipkie_rejections", "requests refused or abandoned, by reason", ["reason"], registry=r
        )

    def bind(
        self,
        queue_depth: Callable[[], float],
        loading: Callable[[], float],
        active: Callable[[], float],
        estimated_wait: Callable[[], float],
    ) -> None:
        """Gauges read at scrape time from the service's state."""
        self.queue_depth.set_function(queue_depth)
        self.loading.set_function(loading)
        self.active.set_function(active)
        self.estimated_wait.set_function(estimated_wait)

    def model_call(self, documents: int, seconds: float, failed: bool) -> None:
        self.batch_size.observe(documents)
        self.call_seconds.observe(seconds)
        if failed:
            self.call_failures.inc()

    def answered(self, status: int, code: str) -> None:
        """Count an answer (every error answer is counted by the app's error handlers)."""
        self.responses.labels(str(status), code).inc()
        if code in REJECTIONS:
            self.rejections.labels(code).inc()

    def latency(self, status: int, seconds: float) -> None:
        self.request_seconds.labels(str(status)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
