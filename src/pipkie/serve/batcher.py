"""Dynamic batching for the service: a bounded queue of loaded documents, run through the model in groups.

One worker task takes what is queued (up to `max_batch` jobs, waiting at most `max_wait_ms` for
more after the first), groups them by (decode, refine steps, key schema) and runs one
`Extractor.extract_many` per group: for PIP, one forward pass over the group. Model calls run one at
a time in a dedicated thread so the event loop stays responsive. If a group fails, its jobs are
retried one by one, so only the job at fault gets the error; the worker never stops.

Bounded, so that overload is refused at once instead of queueing without end:
- at most `max_queue` jobs wait; `submit` raises `QueueFull` beyond that;
- `estimated_wait()` says how long a job queued now would take to come back (the running call's
  remainder plus every queued document at the measured seconds per document), so the service can
  answer 503 up front when a request's deadline is shorter;
- a job whose future is done (its request timed out or its client left) or whose deadline has
  passed is dropped when the worker reaches it, never run;
- `stop()` fails every job still queued with `ShuttingDown` (never a silent drop).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pipkie.io.document import Document
from pipkie.schema import KeySchema

log = logging.getLogger("pipkie.serve")


class QueueFull(Exception):
    """`max_queue` jobs are already waiting for the model."""


class ShuttingDown(Exception):
    """The batcher is stopping: the job was not (and will not be) run."""


class DeadlineExceeded(Exception):
    """The job's deadline passed before the model reached it."""


class RunningMean:
    """Exponentially weighted mean (weight `alpha` for each new value) and mean deviation; `value` is
    None until the first update unless a prior is given.

    `upper` = mean + 4 × mean deviation, as TCP sizes its retransmission timeout from measured round
    trips (RFC 6298): what admission plans with, so that a service whose call times vary (a busy
    neighbour on the same cores, documents of different lengths) refuses at once rather than admits
    work it then answers after the deadline."""

    def __init__(self, prior: float | None = None, alpha: float = 0.2, beta: float = 0.25):
        self.value, self.alpha, self.beta, self.deviation = prior, alpha, beta, 0.0

    def update(self, x: float) -> None:
        if self.value is None:
            self.value = x
            return
        self.deviation = (1 - self.beta) * self.deviation + self.beta * abs(x - self.value)
        self.value = (1 - self.alpha) * self.value + self.alpha * x

    @property
    def upper(self) -> float | None:
        return None if self.value is None else self.value + 4 * self.deviation


@dataclass
class Job:
    doc: Document
    schema: KeySchema
    decode: str
    refine_steps: int
    deadline: float  # event-loop time (loop.time()) after which the job is not worth running
    future: asyncio.Future


class Batcher:
    """Bounded queue of loaded documents; one worker task batches them into `extract_many` calls.

    on_call(documents, seconds, failed): called after every model call (metrics).
    """

    def __init__(
        self,
        get_extractor: Callable,
        max_batch: int = 8,
        max_wait_ms: float = 10,
        max_queue: int = 32,
        on_call: Callable[[int, float, bool], None] | None = None,
    ):
        self.get_extractor = get_extractor
        self.max_batch, self.max_wait = max(1, int(max_batch)), max(0.0, max_wait_ms / 1000)
        self.max_queue = max(1, int(max_queue))
        self.on_call = on_call
        self.seconds_per_doc = RunningMean()  # measured on every call (and by warm_up)
        self._executor: ThreadPoolExecutor | None = None  # one thread: one model call at a time
        self._queue: deque[Job] = deque()
        self._ready: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = (0, 0.0)  # (documents of the collected batch not done yet, when its current call began)
        self.closed = False
        self.stats = {
            "batches": 0,
            "model_calls": 0,
            "documents": 0,
            "largest_call": 0,
            "failed_calls": 0,
            "expired": 0,
        }

    @property
    def queued(self) -> int:
        """Jobs waiting for the model whose requests still want them."""
        return sum(1 for j in self._queue if not j.future.done())

    @property
    def busy(self) -> bool:
        """A model call is running or a job is waiting."""
        return bool(self._running[0]) or self.queued > 0

    def estimated_wait(self, coming: int = 0) -> float:
        """Seconds until a job submitted now would be answered, behind `coming` more jobs on their
        way (documents still loading); 0 before anything was measured.

        Counted in whole model calls: a job's answer comes when its call ends, and on a busy service
        the jobs that arrive after it fill its call up to `max_batch` (counting only the jobs ahead of
        it under-estimated by up to max_batch - 1 documents, and answers came after their deadline)."""
        per_doc = self.seconds_per_doc.upper
        if per_doc is None:
            return 0.0
        docs, since = self._running
        running = max(0.0, docs * per_doc - (time.monotonic() - since)) if docs else 0.0
        ahead = self.queued + coming + 1  # this job included
        per_call = self.max_batch if self.busy else min(ahead, self.max_batch)
        return running + math.ceil(ahead / self.max_batch) * per_call * per_doc + self.max_wait

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): fresh queue
            self._loop, self._queue, self._ready, self._task = loop, deque(), asyncio.Event(), None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pipkie-model")
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="pipkie-batcher")

    def submit(
        self, doc: Document, schema: KeySchema, decode: str, refine_steps: int, deadline: float | None = None
    ) -> asyncio.Future:
        """Queue a job; its future gets the Extraction (or the exception). QueueFull when full,
        ShuttingDown once stopping. Cancelling the future withdraws the job."""
        if self.closed:
            raise ShuttingDown("the service is shutting down")
        self._ensure_worker()
        if self.queued >= self.max_queue:
            raise QueueFull(f"{self.max_queue} requests are already waiting for the model")
        loop = asyncio.get_running_loop()
        job = Job(
            doc, schema, decode, refine_steps, deadline if deadline is not None else float("inf"), loop.create_future()
        )
        self._queue.append(job)
        self._ready.set()
        return job.future

    async def warm_up(self, doc: Document, schema: KeySchema) -> float:
        """One model call on `doc` outside the queue, to load lazy state and measure the seconds per
        document that `estimated_wait` starts from. Returns them."""
        self._ensure_worker()
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: self.get_extractor().extract_many([doc], schema=schema, batch_size=1)
        )
        seconds = time.perf_counter() - t0
        self.seconds_per_doc.update(seconds)
        return seconds

    async def stop(self) -> None:
        """Refuse new jobs, fail queued ones with ShuttingDown, stop the worker and its thread."""
        self.closed = True
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(ShuttingDown("the service shut down before this request reached the model"))
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def reopen(self) -> None:
        """Accept jobs again after a stop (an app started a second time)."""
        self.closed = False

    def _pop_live(self, now: float) -> Job | None:
        while self._queue:
            job = self._queue.popleft()
            if job.future.done():
                continue
            if job.deadline <= now:
                self.stats["expired"] += 1
                job.future.set_exception(DeadlineExceeded("the deadline passed while the request was queued"))
                continue
            return job
        return None

    async def _collect(self) -> list[Job]:
        loop = asyncio.get_running_loop()
        while True:
            job = self._pop_live(loop.time())
            if job is not None:
                break
            self._ready.clear()
            await self._ready.wait()
        batch = [job]
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            job = self._pop_live(loop.time())
            if job is not None:
                batch.append(job)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._process(batch)
            except asyncio.CancelledError:
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(ShuttingDown("the service shut down while this request ran"))
                raise
            except Exception as e:  # a bug here must not kill the worker: fail this batch only
                log.exception("batch failed")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
            finally:
                self._running = (0, 0.0)

    async def _process(self, batch: list[Job]) -> None:
        live = [j for j in batch if not j.future.done()]  # timed-out or abandoned requests are skipped
        if not live:
            return
        self.stats["batches"] += 1
        groups: dict[tuple, list[Job]] = {}
        for j in live:
            groups.setdefault((j.decode, j.refine_steps, j.schema), []).append(j)
        left = len(live)
        for jobs in groups.values():
            self._running = (left, time.monotonic())
            await self._run_group(jobs)
            left -= len(jobs)

    async def _run_group(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]
        if not jobs:
            return
        first = jobs[0]
        loop = asyncio.get_running_loop()
        docs = [j.doc for j in jobs]
        try:
            results = await loop.run_in_executor(
                self._executor, self._call, docs, first.schema, first.decode, first.refine_steps
            )
        except Exception as e:
            if len(jobs) > 1:  # find the request that fails: each one alone
                for j in jobs:
                    await self._run_group([j])
                return
            if not first.future.done():
                first.future.set_exception(e)
            return
        for j, r in zip(jobs, results):
            if not j.future.done():
                j.future.set_result(r)

    def _call(self, docs, schema, decode, refine_steps):
        self.stats["model_calls"] += 1
        self.stats["documents"] += len(docs)
        self.stats["largest_call"] = max(self.stats["largest_call"], len(docs))
        t0, failed = time.perf_counter(), True
        try:
            out = self.get_extractor().extract_many(
                docs, schema=schema, decode=decode, refine_steps=refine_steps, batch_size=len(docs)
            )
            failed = False
            return out
        finally:
            seconds = time.perf_counter() - t0
            if failed:
                self.stats["failed_calls"] += 1
            else:
                self.seconds_per_doc.update(seconds / len(docs))
            if self.on_call is not None:
                self.on_call(len(docs), seconds, failed)
