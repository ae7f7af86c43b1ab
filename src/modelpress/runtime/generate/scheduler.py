"""Continuous batching: requests join the running batch between decode steps and leave when done.

One ``Scheduler`` drives one model. Each iteration (``step()``) it

1. ends the requests cancelled since the last step (a client that disconnected): a waiting one
   never starts, a running one leaves the batch and frees its slot for this very iteration;
2. admits waiting requests, oldest first, while fewer than ``max_seqs`` run or are prefilled,
   and runs the admitted prompts' next chunk (``Engine.prefill``: at most ``prefill_chunk``
   tokens while others run, so a long prompt delays the running streams by one chunk a step,
   not by its whole length); a prompt whose last chunk ran gets its first token and joins;
3. runs one decode step over every running sequence; finished sequences leave the batch.

Each request's events (``sequence.Event``: newly released text, the token, and on the last one
the ``GenerationResult``) go to its sink as soon as the step that made them ends.

Limits: at most ``max_seqs`` sequences run at once (the rest wait in arrival order, at most
``max_waiting`` of them: ``QueueFullError`` beyond), and a
request whose prompt plus ``max_tokens`` exceeds ``max_context`` (default: the model's) is refused
when it is submitted, with an ``InputError`` naming the limit; bad sampling values raise
``OptionError`` naming the field (``SamplingParams``). Both happen in the caller's thread, before
anything is queued, so a server can answer 400.

Using it from asyncio (the OpenAI routes)::

    scheduler = Scheduler(open_llm(folder), max_seqs=16)
    scheduler.start()                       # one background thread runs the decode loop
    ...
    stream = await scheduler.submit(Request(messages=[...], params=SamplingParams(...)))
    async for event in stream:              # ModelpressError raised by the await: answer 400
        send(event.text)                    # event.result on the last event: usage counts, ...
    ...
    scheduler.cancel(request_id)            # or just stop iterating / aclose() the stream
    scheduler.close()

Leaving the ``async for`` early (the client went away: the task is cancelled, or the stream is
closed) cancels the request: its slot is free at the next step. ``metrics`` (``GenerationMetrics``)
counts requests, tokens and steps and calls the hooks it was given with time to first token,
inter-token latency and step times. ``stats()`` is a snapshot for a health or metrics route.

Batched equals solo: a prompt is prefilled alone, in chunks whose bounds do not depend on the
batch (its cache is what a solo run computes), and a decode step differs from a solo one only by
the other rows and by masked columns (zeros with no attention weight). With the left-aligned
caches (``ir.llm``: ``in_place``, ``left_aligned``) a row's entries sit at the same columns
whatever the batch and every step sees a masked column after each row, and a row's logits are
the same bits batched as alone (tested with int4 ``MatMulNBits`` weights, whose activations are
quantized per block: the case where a last-bit difference does turn into another token). Folders
of the older ``append`` layout put a row behind the batch's hole columns: its sums round
otherwise, and int4 answers can differ from their solo run (``LLM.batch_invariant``).

Without ``start()`` the scheduler is driven by its caller: ``run(requests)`` and ``stream(request)``
call ``step()`` themselves (``Generator`` does this; no thread involved).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from modelpress.errors import InputError, ModelpressError, OptionError
from modelpress.runtime.generate.engine import PREFILL_CHUNK, Engine
from modelpress.runtime.generate.metrics import GenerationMetrics
from modelpress.runtime.generate.sampling import SamplingParams
from modelpress.runtime.generate.sequence import Event, GenerationResult, Sequence


@dataclass
class Request:
    """A prompt (text, chat messages or token ids) and how to generate from it."""

    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    chat_template: bool = True  # render ``messages`` with the model's chat template
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


Sink = Callable[[Event], None]


class QueueFullError(ModelpressError):
    """More requests wait than ``max_waiting`` allows (a server answers 429 / 503)."""


class Scheduler:
    def __init__(
        self,
        llm,
        *,
        max_seqs: int = 8,
        max_context: int | None = None,
        metrics: GenerationMetrics | None = None,
        max_waiting: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        """``llm``: an ``LLM`` (``open_llm``), or any object with its ``decoder``, ``config``,
        ``tokenizer`` and ``prompt_ids``. ``max_waiting``: refuse a request (``QueueFullError``)
        when that many already wait for a slot (None: no limit). ``prefill_chunk``: prompt
        tokens run a step while other sequences run (``Engine``)."""
        config = llm.config
        for name, value in (("max_seqs", max_seqs), ("prefill_chunk", prefill_chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"`{name}` must be an integer of at least 1, got {value!r}")
        if max_context is None:
            max_context = config.max_context
        if not isinstance(max_context, int) or not 1 <= max_context <= config.max_context:
            raise OptionError(
                f"`max_context` must be an integer from 1 to the model's {config.max_context}, "
                f"got {max_context!r}"
            )
        self.llm = llm
        self.max_seqs = max_seqs
        self.max_context = max_context
        self.max_waiting = max_waiting
        self.metrics = metrics or GenerationMetrics()
        self.engine = Engine(llm.decoder, config, prefill_chunk=prefill_chunk)
        self._waiting: deque[Sequence] = deque()
        self._sinks: dict[str, Sink] = {}
        self._cancelled: set[str] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- submitting ----------------------------------------------------------------------------

    def prepare(self, request: Request) -> Sequence:
        """The sequence of ``request``, checked against the limits (raises, queues nothing)."""
        params = request.params
        if not isinstance(params, SamplingParams):
            raise OptionError("`params` must be a SamplingParams")
        if request.prompt_ids is not None:
            ids = [int(t) for t in request.prompt_ids]
            vocab = self.llm.config.vocab_size
            if not ids or any(not 0 <= t < vocab for t in ids):
                raise InputError(f"`prompt_ids` must be token ids from 0 to {vocab - 1}")
        else:
            ids = self.llm.prompt_ids(
                request.prompt, messages=request.messages, chat_template=request.chat_template
            )
        if len(ids) + params.max_tokens > self.max_context:
            raise InputError(
                f"the prompt ({len(ids)} tokens) plus `max_tokens` ({params.max_tokens}) is over "
                f"the context limit of {self.max_context} tokens (`max_context`)"
            )
        eos = params.eos_token_ids if params.eos_token_ids is not None else self._eos()
        return Sequence(request.request_id, ids, params, frozenset(eos), self.llm.tokenizer)

    def _eos(self) -> tuple[int, ...]:
        return tuple(self.llm.config.eos_token_ids)

    def add(self, request: Request, sink: Sink) -> Sequence:
        """Queue ``request``; its events go to ``sink`` (called on the stepping thread)."""
        seq = self.prepare(request)
        with self._cond:
            if self._closed:
                raise OptionError("the scheduler is closed")
            if seq.request_id in self._sinks:
                raise InputError(f"request id {seq.request_id!r} is already running")
            if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
                raise QueueFullError(
                    f"{len(self._waiting)} requests already wait for a slot (`max_waiting`)"
                )
            self._sinks[seq.request_id] = sink
            self._waiting.append(seq)
            self._cond.notify()
        return seq

    async def submit(self, request: Request) -> AsyncIterator[Event]:
        """Queue ``request`` and return its events as an async iterator (needs ``start()``).
        Raises at once (``InputError``/``OptionError``) when the request is refused."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, event)

        seq = self.add(request, sink)
        return self._events(seq.request_id, events)

    async def _events(self, request_id: str, events: asyncio.Queue) -> AsyncIterator[Event]:
        done = False
        try:
            while not done:
                event = await events.get()
                done = event.finished
                yield event
        finally:
            if not done:
                self.cancel(request_id)

    def stream(self, request: Request) -> Iterator[Event]:
        """The events of ``request`` as they come: from the running thread after ``start()``,
        else by stepping the scheduler in this thread."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        seq = self.add(request, events.put)
        done = False
        try:
            while not done:
                if self._thread is None:
                    while events.empty():
                        self.step()
                event = events.get()
                done = event.finished
                yield event
        finally:
            if not done:
                self.cancel(seq.request_id)
                if self._thread is None:
                    self.step()

    def run(self, requests: list[Request]) -> list[GenerationResult]:
        """Generate ``requests`` together (continuous batching within ``max_seqs``), in order."""
        results: dict[str, GenerationResult] = {}

        def sink(event: Event) -> None:
            if event.result is not None:
                results[event.request_id] = event.result

        seqs = [self.add(r, sink) for r in requests]
        while len(results) < len(seqs):
            if self._thread is None:
                self.step()
            else:
                time.sleep(0.001)
        return [results[s.request_id] for s in seqs]

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` (waiting or running) at the next step; unknown ids are ignored."""
        with self._cond:
            if request_id in self._sinks:
                self._cancelled.add(request_id)
                self._cond.notify()

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """One iteration: cancellations, admissions (prefill), one decode step."""
        gone: list[Sequence] = []
        with self._cond:
            cancelled, self._cancelled = self._cancelled, set()
            if cancelled:
                gone = [s for s in self._waiting if s.request_id in cancelled]
                self._waiting = deque(s for s in self._waiting if s.request_id not in cancelled)
        events = [s.end("cancelled") for s in gone]
        admitted: list[Sequence] = []
        try:
            if cancelled:
                events += self.engine.cancel(cancelled)
            if self._waiting:
                with self._cond:
                    while self._waiting and self.engine.active + len(admitted) < self.max_seqs:
                        admitted.append(self._waiting.popleft())
            for seq in admitted:
                self.metrics.started(len(seq.prompt_ids))
            self.engine.admit(admitted)
            if self.engine.prefilling:
                events += self.engine.prefill()
            running = len(self.engine.running)
            start = time.perf_counter()
            decoded = self.engine.decode()
            if running:
                self.metrics.step(running, time.perf_counter() - start)
            events += decoded
        except Exception as exc:  # a failed step ends what it was running, not the loop
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            ids = {s.request_id for s in self.engine.running}
            ids |= {p.seq.request_id for p in self.engine.prefilling}
            events += self.engine.cancel(ids, reason="error", error=message)
        self._deliver(events)
        return events

    def _deliver(self, events: list[Event]) -> None:
        for event in events:
            with self._cond:
                sink = self._sinks.get(event.request_id)
                if event.finished:
                    self._sinks.pop(event.request_id, None)
                    self._cancelled.discard(event.request_id)
            if event.token_id is not None:
                self.metrics.tokens(1)
                if event.index == 0:
                    self.metrics.first_token(event.latency_s)
                else:
                    self.metrics.inter_token(event.latency_s)
            if event.finished:
                self.metrics.finished(event.result)
            if sink is not None:
                try:
                    sink(event)
                except Exception:  # a broken listener: stop generating for it
                    self.cancel(event.request_id)

    def start(self) -> Scheduler:
        """Run the decode loop on a background thread (for ``submit``)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="modelpress-generate", daemon=True
                )
                self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._waiting or self._cancelled or self.engine.active):
                    self._cond.wait()
                if self._closed:
                    break
            try:
                self.step()
            except Exception as exc:  # a bug outside the model step: end everything, keep going
                self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> None:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            sinks, self._sinks = dict(self._sinks), {}
        running = self.engine.reset()
        for seq in waiting + running:
            if not seq.finished:
                event = seq.end("error", message)
                sink = sinks.get(seq.request_id)
                if sink is not None:
                    with contextlib.suppress(Exception):
                        sink(event)

    def close(self) -> None:
        """Stop the loop; requests still waiting or running end as cancelled."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        with self._cond:
            self._cancelled |= set(self._sinks)
        if self._sinks:
            self.step()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        with self._cond:
            waiting = len(self._waiting)
        return {
            "running": len(self.engine.running),
            "prefilling": len(self.engine.prefilling),
            "waiting": waiting,
            "max_seqs": self.max_seqs,
            "max_context": self.max_context,
            "cache_columns": self.engine.cache.columns,
            "cache_bytes": self.engine.cache.nbytes(),
            **self.metrics.to_dict(),
        }
