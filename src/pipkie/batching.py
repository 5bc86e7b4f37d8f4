"""Dynamic batching for the service: queued requests go through the model in groups.

One worker task takes what is queued (up to `max_batch` requests, waiting at most `max_wait_ms`
for more after the first), groups them by (decode, refine steps, key schema) and runs one
`Extractor.extract_many` per group: for PIP, one forward pass over the group. Model calls run one at
a time in a dedicated thread so the event loop stays responsive. If a group fails, its requests
are retried one by one, so only the request at fault gets the error; the worker never stops.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from pipkie.document import Document
from pipkie.schema import KeySchema

log = logging.getLogger("pipkie.serve")


@dataclass
class _Job:
    doc: Document
    schema: KeySchema
    decode: str
    refine_steps: int
    future: asyncio.Future


class Batcher:
    """Queue of loaded documents; one worker task batches them into `extract_many` calls."""

    def __init__(self, get_extractor: Callable, max_batch: int = 8, max_wait_ms: float = 10):
        self.get_extractor = get_extractor
        self.max_batch, self.max_wait = max(1, int(max_batch)), max(0.0, max_wait_ms / 1000)
        self._executor: ThreadPoolExecutor | None = None  # one thread: one model call at a time
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = {"batches": 0, "model_calls": 0, "documents": 0, "largest_call": 0, "failed_calls": 0}

    @property
    def queued(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): fresh queue
            self._loop, self._queue, self._task = loop, asyncio.Queue(), None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pipkie-model")
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="pipkie-batcher")

    async def submit(self, doc: Document, schema: KeySchema, decode: str, refine_steps: int) -> asyncio.Future:
        self._ensure_worker()
        job = _Job(doc, schema, decode, refine_steps, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return job.future

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _collect(self) -> list[_Job]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
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
                        job.future.cancel()
                raise
            except Exception as e:  # a bug here must not kill the worker: fail this batch only
                log.exception("batch failed")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)

    async def _process(self, batch: list[_Job]) -> None:
        live = [j for j in batch if not j.future.done()]  # timed-out requests are skipped
        if not live:
            return
        self.stats["batches"] += 1
        groups: dict[tuple, list[_Job]] = {}
        for j in live:
            groups.setdefault((j.decode, j.refine_steps, j.schema), []).append(j)
        for jobs in groups.values():
            await self._run_group(jobs)

    async def _run_group(self, jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]
        if not jobs:
            return
        first = jobs[0]
        loop = asyncio.get_running_loop()
        docs = [j.doc for j in jobs]
        try:
            results = await loop.run_in_executor(self._executor, self._call, docs, first.schema, first.decode,
                                                 first.refine_steps)
        except Exception as e:
            self.stats["failed_calls"] += 1
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
        return self.get_extractor().extract_many(docs, schema=schema, decode=decode, refine_steps=refine_steps,
                                                 batch_size=len(docs))


# ---- request parsing ----------------------------------------------------------------------------
