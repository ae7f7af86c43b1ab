"""What the scheduler measures, as counters and as callbacks for a server's exporter.

``GenerationMetrics`` counts requests, tokens and steps, and calls the hooks it was given (plain
callables, e.g. a Prometheus histogram's ``observe``) with each measurement as it happens:

- ``on_time_to_first_token(seconds)``: from a request's arrival to its first token;
- ``on_inter_token_latency(seconds)``: between two tokens of one request;
- ``on_step(rows, seconds)``: one decode step over ``rows`` sequences;
- ``on_finished(result)``: a request's ``GenerationResult``.

The hooks run on the scheduler's thread: keep them short and thread-safe. A hook that raises is
dropped from then on (counted in ``hook_errors``): a broken exporter must not stop generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from modelpress.runtime.generate.sequence import GenerationResult


@dataclass
class GenerationMetrics:
    on_time_to_first_token: Callable[[float], None] | None = None
    on_inter_token_latency: Callable[[float], None] | None = None
    on_step: Callable[[int, float], None] | None = None
    on_finished: Callable[[GenerationResult], None] | None = None
    requests_started: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    started_at: float = field(default_factory=time.perf_counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    hook_errors: int = 0

    def _call(self, name: str, *args) -> None:
        hook = getattr(self, name)
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            setattr(self, name, None)
            self.hook_errors += 1

    def first_token(self, seconds: float) -> None:
        self._call("on_time_to_first_token", seconds)

    def inter_token(self, seconds: float) -> None:
        self._call("on_inter_token_latency", seconds)

    def step(self, rows: int, seconds: float) -> None:
        with self._lock:
            self.decode_steps += 1
            self.decode_seconds += seconds
        self._call("on_step", rows, seconds)

    def started(self, prompt_tokens: int) -> None:
        with self._lock:
            self.requests_started += 1
            self.prompt_tokens += prompt_tokens

    def tokens(self, n: int) -> None:
        with self._lock:
            self.completion_tokens += n

    def finished(self, result: GenerationResult) -> None:
        with self._lock:
            self.requests_finished += 1
            self.requests_cancelled += result.finish_reason == "cancelled"
        self._call("on_finished", result)

    def to_dict(self) -> dict:
        with self._lock:
            elapsed = time.perf_counter() - self.started_at
            return {
                "requests_started": self.requests_started,
                "requests_finished": self.requests_finished,
                "requests_cancelled": self.requests_cancelled,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "decode_steps": self.decode_steps,
                "decode_seconds": self.decode_seconds,
                "tokens_per_s": self.completion_tokens / elapsed if elapsed > 0 else 0.0,
            }
