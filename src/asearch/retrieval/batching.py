"""`MicroBatcher`: concurrent searches merged into one batched `retriever.search` call in a worker thread.

The retrieval server and the in-process `search` tool share it; it needs no web framework.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from asearch.retrieval.base import Retriever, SearchHit

__all__ = ["MicroBatcher"]


@dataclass(slots=True)
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[SearchHit]]]


class MicroBatcher:
    """Merge concurrent `search` calls into one `retriever.search(all_queries, max_topk)` per batch.

    While all `workers` are busy, new calls queue up; when a worker frees, everything queued (up to
    `max_batch` queries) goes out as one batch at once, so batches grow with load. A call that reaches an
    idle batcher waits up to `window_s` for company before its batch starts. A call larger than `max_batch`
    (a trainer's whole rollout batch in one request) queues as parts of `max_batch` queries, which go out
    one batch each, FIFO with everyone else's: `max_batch` bounds what one retriever call holds.

    Each caller gets the first `topk` hits of its own queries, so retrievers must rank deterministically:
    a top-k list must be a prefix of the top-K list (K >= k), ties broken in a fixed order.
    """

    def __init__(
        self,
        retriever: Retriever,
        *,
        window_s: float = 0.0,
        max_batch: int = 256,
        workers: int = 1,
        on_batch: Callable[[int, float], None] | None = None,
    ):
        self.retriever = retriever
        self.window_s, self.max_batch, self.workers = window_s, max_batch, workers
        self._on_batch = on_batch
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        """The top `topk` hits of each query, in order; a call with more than `max_batch` queries is searched
        in parts of `max_batch`, so no retriever call ever holds more than that (the memory bound)."""
        if not queries:
            return []
        queue = self._bind_to_running_loop()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[list[list[SearchHit]]]] = []
        for start in range(0, len(queries), self.max_batch):
            futures.append(loop.create_future())
            queue.put_nowait(_Pending(list(queries[start : start + self.max_batch]), topk, futures[-1]))
        try:
            parts = await asyncio.gather(*futures)
        except BaseException:
            for f in futures:  # the other parts: unqueued, or their failure read, so none is left dangling
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise
        return [row for part in parts for row in part]

    def close(self) -> None:
        """Stop collecting and release the worker threads; a later `search` starts afresh."""
        if self._collector is not None and not self._collector.done():
            self._collector.cancel()
        self._collector = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # The batcher binds to the loop of its first caller; a new loop (e.g. a fresh asyncio.run, or the
    # same app served again) rebinds, with a fresh collector and, after close(), fresh worker threads.
    def _bind_to_running_loop(self) -> asyncio.Queue[_Pending]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._queue is None or self._collector is None or self._collector.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._collector = loop.create_task(self._collect(self._queue), name="asearch-batch-collector")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.workers, thread_name_prefix="asearch-retrieve"
            )
        return self._queue

    async def _collect(self, queue: asyncio.Queue[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.workers)
        carry: _Pending | None = None  # a request that did not fit the previous batch opens the next one
        while True:
            await slots.acquire()  # wait for a free worker *before* collecting: queued work merges meanwhile
            # Work that piled up while the workers were busy goes out at once; only a batch opened by a
            # request reaching an idle batcher waits the window for company (a wait idles the worker).
            backlog = carry is not None or not queue.empty()
            first = carry if carry is not None else await queue.get()
            carry = None
            batch, size = [first], len(first.queries)
            deadline = loop.time() + (0.0 if backlog else self.window_s)
            while size < self.max_batch:
                try:
                    nxt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        async with asyncio.timeout(remaining):  # not wait_for: it can swallow a cancel
                            nxt = await queue.get()
                    except TimeoutError:
                        break
                if size + len(nxt.queries) > self.max_batch:
                    carry = nxt
                    break
                batch.append(nxt)
                size += len(nxt.queries)
            task = loop.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(lambda _t: slots.release())

    async def _run(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]  # a disconnected client cancels its future
        if not live:
            return
        queries = [q for p in live for q in p.queries]
        topk = max(p.topk for p in live)
        start = time.perf_counter()
        try:
            if self._executor is None:
                raise RuntimeError("the batcher was closed while this search waited")
            hits = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.retriever.search, queries, topk
            )
            if len(hits) != len(queries):
                raise RuntimeError(
                    f"retriever {getattr(self.retriever, 'name', '?')!r} returned {len(hits)} result lists "
                    f"for {len(queries)} queries"
                )
        except asyncio.CancelledError:  # server shutting down
            for p in live:
                p.future.cancel()
            raise
        except Exception as e:  # every waiter of the batch hears about the failure
            for p in live:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        if self._on_batch is not None:
            self._on_batch(len(queries), time.perf_counter() - start)
        offset = 0
        for p in live:
            rows = hits[offset : offset + len(p.queries)]
            offset += len(p.queries)
            if not p.future.done():
                p.future.set_result([list(row[: p.topk]) for row in rows])
