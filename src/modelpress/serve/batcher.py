"""Dynamic batching in plain asyncio: requests queue per model and run together.

Rules, for one model:

- One batch runs at a time, on the model's own thread (the runtime releases the GIL, so the event
  loop keeps reading requests meanwhile). Requests that arrive while the model is busy wait, and the
  next batch takes them together: under load, batches form by themselves.
- A batch holds only requests with the same key (the shapes of every input past axis 0), oldest
  first, up to ``max_batch`` rows; a request bigger than that runs alone. Requests with key ``None``
  (a model whose outputs are not per-row, a request of zero rows) always run alone.
- When the model is idle and a batch is not full, the batcher waits up to ``max_delay`` for more,
  but only while another request is on its way in (being read or decoded): waiting when nobody is
  coming would only add latency.
- At most ``max_queue`` requests wait; one more is refused at once (``Overloaded``, 503).
- A batch whose run fails is run again one request at a time, so the request that broke it gets its
  own error and its batch-mates their answers; so is a batch whose outputs turn out not to have one
  row per input row.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from modelpress.serve.errors import Overloaded
from modelpress.serve.metrics import Metrics

Feeds = dict[str, np.ndarray]


@dataclass
class _Pending:
    feeds: Feeds
    rows: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(
        self,
        name: str,
        run: Callable[[Feeds], Feeds],
        *,
        max_batch: int = 32,
        max_delay_s: float = 0.002,
        max_queue: int = 256,
        metrics: Metrics | None = None,
        arriving: Callable[[], int] = lambda: 0,
    ):
        self.name = name
        self._run_model = run
        self.max_batch = max(1, max_batch)
        self.max_delay_s = max(0.0, max_delay_s)
        self.max_queue = max(1, max_queue)
        self.metrics = metrics.model(name) if metrics is not None else None
        if self.metrics is not None:  # read when scraped, not set on every request
            self.metrics.queue_depth.set_function(lambda: self._queued)
        self._arriving = arriving
        self._queues: dict[tuple | None, deque[_Pending]] = {}
        self._rows: dict[tuple | None, int] = {}
        self._queued = 0
        self._running = 0  # requests in the batch being run
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{name}")

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def pending(self) -> int:
        """Requests accepted and not yet answered (queued or running)."""
        return self._queued + self._running

    async def submit(self, feeds: Feeds, rows: int, key: tuple | None) -> Feeds:
        """The outputs for one request's ``feeds``, run in a batch with others of the same ``key``."""
        if self._queued >= self.max_queue:
            raise Overloaded(
                f"model {self.name!r} has {self._queued} requests waiting (--max-queue {self.max_queue}): retry later"
            )
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._schedule())
        item = _Pending(feeds, rows, asyncio.get_running_loop().create_future())
        if key is not None and rows > self.max_batch:
            key = None  # too big to share a batch
        self._queues.setdefault(key, deque()).append(item)
        self._rows[key] = self._rows.get(key, 0) + rows
        self._queued += 1
        self._wake.set()
        return await item.future

    async def _schedule(self) -> None:
        while True:
            if not self._queues:
                self._wake.clear()
                await self._wake.wait()
                continue
            key = min(self._queues, key=lambda k: self._queues[k][0].arrived)
            if key is not None and self.max_delay_s > 0:
                await self._fill(key)
            batch = self._take(key)
            if batch:
                await self._run(batch)

    async def _fill(self, key: tuple) -> None:
        """Wait, up to max_delay after the oldest request arrived, while the batch is not full
        and more requests are on their way in."""
        deadline = self._queues[key][0].arrived + self.max_delay_s
        while self._rows.get(key, 0) < self.max_batch and self._arriving() > 0:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self, key: tuple | None) -> list[_Pending]:
        queue = self._queues[key]
        batch: list[_Pending] = []
        rows = 0
        while queue:
            head = queue[0]
            if batch and (key is None or rows + head.rows > self.max_batch):
                break
            queue.popleft()
            self._queued -= 1
            self._rows[key] -= head.rows
            if head.future.done():  # its client went away (cancelled): nothing to run
                continue
            batch.append(head)
            rows += head.rows
        if not queue:
            del self._queues[key]
            del self._rows[key]
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        self._running = len(batch)
        try:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(
                self._executor, self._execute, [p.feeds for p in batch], [p.rows for p in batch]
            )
        except asyncio.CancelledError:  # closing: nobody will run these any more
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(Overloaded(f"model {self.name!r} is shutting down"))
            raise
        except Exception as exc:  # the executor itself failed: every request gets the error
            results = [exc] * len(batch)
        finally:
            self._running = 0
        for pending, result in zip(batch, results):
            if pending.future.done():
                continue
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)

    # --- on the model's thread ---------------------------------------------------------------

    def _execute(self, feeds: list[Feeds], rows: list[int]) -> list[Feeds | BaseException]:
        if len(feeds) == 1:
            return [self._call(feeds[0], rows[0])]
        total = sum(rows)
        stacked = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
        try:
            out = self._timed(stacked, total)
        except Exception:
            return [self._call(f, r) for f, r in zip(feeds, rows)]
        if any(v.ndim == 0 or v.shape[0] != total for v in out.values()):
            return [self._call(f, r) for f, r in zip(feeds, rows)]
        bounds = np.cumsum(rows)[:-1]
        parts = {name: np.split(v, bounds) for name, v in out.items()}
        return [{name: parts[name][i] for name in out} for i in range(len(feeds))]

    def _call(self, feeds: Feeds, rows: int) -> Feeds | BaseException:
        try:
            return self._timed(feeds, rows)
        except Exception as exc:
            return exc

    def _timed(self, feeds: Feeds, rows: int) -> Feeds:
        start = time.perf_counter()
        try:
            return self._run_model(feeds)
        finally:
            if self.metrics is not None:
                self.metrics.busy.inc(time.perf_counter() - start)
                self.metrics.batch_size.observe(rows)
                self.metrics.inferences.inc(rows)

    async def close(self) -> None:
        """Stop scheduling (after the server has answered what it accepted) and free the thread."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for queue in self._queues.values():
            for p in queue:
                if not p.future.done():
                    p.future.set_exception(Overloaded(f"model {self.name!r} is shutting down"))
        self._queues.clear()
        self._executor.shutdown(wait=True)
