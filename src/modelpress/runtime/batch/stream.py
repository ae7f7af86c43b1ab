"""The batch loop: pre-processing in worker processes, a bounded prefetch queue, inference on the
calling thread, overlapping.

Batches are handed to a pool of ``workers`` processes, at most ``prefetch`` of them at a time (the
queue's bound: memory stays flat however large the data set), and taken back in the order they
were given, so results come out in input order. While the model runs batch k, the workers prepare
batches k+1 ... k+prefetch. Each worker decodes and transforms its batch's items and collates them
into the model's feeds, so the calling thread only runs the model and hands the results on.

Timing: ``busy`` is the time inside the model, ``emit`` the time spent handing results on
(answers, the journal), ``wait`` the rest: the model idle for want of input, worker start-up
included. With ``workers=0`` items are prepared inline (nothing overlaps: the baseline).
``start_pool`` starts the workers ahead (while the caller loads the model, say).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelpress.errors import InputError


@dataclass
class Prepared:
    """One batch, ready for the model: the feeds of the items that could be prepared and, for
    each item that could not, its one-line error."""

    items: list[int]  # indices of the items in ``feeds``, in row order
    ids: list[str]
    feeds: dict[str, np.ndarray] | None
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (index, id, message)
    padded: int = 0  # rows appended (copies of the last) to fill a batch the model fixes


@dataclass
class Timing:
    elapsed_s: float = 0.0
    busy_s: float = 0.0
    wait_s: float = 0.0
    emit_s: float = 0.0
    batches: int = 0


# The worker's processing object, set once per worker process by the pool's initializer.
_PROCESSING: Any = None


def _init_worker(processing, owner: int | None = None) -> None:
    global _PROCESSING
    _PROCESSING = processing
    if owner is not None:
        die_with(owner)


def die_with(owner: int, *, every_s: float = 0.5) -> None:
    """End this worker process when process ``owner`` (the one that ran ``run``) is gone.

    A worker's parent is the forkserver, not ``owner``: a SIGKILLed run runs no clean-up, and its
    workers (hundreds of MB each) would live on. On Linux the kernel sends SIGKILL when the parent
    dies (``prctl(PR_SET_PDEATHSIG)``); everywhere, a daemon thread checks that ``owner`` is alive.
    """
    import signal
    import threading

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        except (OSError, AttributeError):  # no libc to call: the thread below still works
            pass

    def watch() -> None:
        while True:
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # alive, under another user (pid reused): keep watching
                pass
            time.sleep(every_s)

    threading.Thread(target=watch, name="modelpress-owner-watch", daemon=True).start()


def prepare_batch(
    batch: list[tuple[int, str, Any]], fixed: int | None = None, processing=None
) -> Prepared:
    """Prepare ``(index, id, payload)`` items into one batch of feeds (runs in a worker)."""
    proc = processing if processing is not None else _PROCESSING
    ok: list[dict[str, np.ndarray]] = []
    items, ids, errors = [], [], []
    for index, item_id, payload in batch:
        try:
            ok.append(proc.prepare(payload, label=item_id))
        except InputError as exc:
            errors.append((index, item_id, str(exc)))
            continue
        items.append(index)
        ids.append(item_id)
    padded = 0
    if ok and fixed is not None and len(ok) < fixed:
        padded = fixed - len(ok)
        ok.extend([ok[-1]] * padded)
    feeds = proc.collate(ok) if ok else None
    return Prepared(items, ids, feeds, errors, padded)


def resolve_workers(workers: int | str | None) -> int:
    """``auto``: one worker per CPU this process may use; 0 prepares inline."""
    if workers in (None, "auto"):
        return max(
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1,
            1,
        )
    n = int(workers)
    if n < 0:
        raise ValueError("workers must be >= 0")
    return n


def _context():
    # forkserver: workers start from a clean process, not a fork of one that already runs
    # ONNX Runtime's threads (forking a threaded process can deadlock in the child).
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # The server imports the processing code once; each worker then starts in milliseconds.
    ctx.set_forkserver_preload(["modelpress.runtime.processing"])
    return ctx


def stream(
    batches: Iterable[list[tuple[int, str, Any]]],
    *,
    processing,
    infer: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    emit: Callable[[Prepared, dict[str, np.ndarray] | None], None],
    workers: int,
    prefetch: int | None = None,
    fixed: int | None = None,
    pool: ProcessPoolExecutor | None = None,
) -> Timing:
    """Prepare each batch (in ``workers`` processes), run ``infer`` on it and ``emit`` the
    result, in input order. ``prefetch`` bounds the batches in flight (2 per worker by default)."""
    timing = Timing()
    start = time.perf_counter()

    def consume(prep: Prepared) -> None:
        outputs = None
        if prep.feeds is not None:
            t0 = time.perf_counter()
            outputs = infer(prep.feeds)
            timing.busy_s += time.perf_counter() - t0
            if prep.padded:
                outputs = {k: v[: len(v) - prep.padded] for k, v in outputs.items()}
        t1 = time.perf_counter()
        emit(prep, outputs)
        timing.emit_s += time.perf_counter() - t1
        timing.batches += 1

    if workers == 0:
        for batch in batches:
            consume(prepare_batch(batch, fixed, processing))
    else:
        bound = max(prefetch or 2 * workers, 1)
        pool = pool or start_pool(processing, workers)
        pending: deque[Future] = deque()
        it = iter(batches)
        try:
            for batch in it:
                pending.append(pool.submit(prepare_batch, batch, fixed))
                if len(pending) >= bound:
                    break
            while pending:
                prep = pending.popleft().result()
                batch = next(it, None)  # refill first, so the workers go on while the model runs
                if batch is not None:
                    pending.append(pool.submit(prepare_batch, batch, fixed))
                consume(prep)
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
    timing.elapsed_s = time.perf_counter() - start
    timing.wait_s = max(timing.elapsed_s - timing.busy_s - timing.emit_s, 0.0)
    return timing


def start_pool(processing, workers: int) -> ProcessPoolExecutor:
    """``workers`` processes holding ``processing``, started now (their start-up then overlaps
    whatever the caller does next); ``stream`` shuts the pool down when it is done."""
    pool = ProcessPoolExecutor(
        workers,
        mp_context=_context(),
        initializer=_init_worker,
        initargs=(processing, os.getpid()),
    )
    for _ in range(workers):
        pool.submit(int)  # a submit starts the processes; the no-op leaves them idle
    return pool
