"""One request being generated: its state, the events it streams and its result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from modelpress.runtime.generate.sampling import SamplingParams, new_rng
from modelpress.runtime.generate.text import Detokenizer, StopMatcher

FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclass
class GenerationResult:
    """What one request produced. ``token_ids`` holds every generated token (an EOS that ended it
    included, as transformers returns it); ``text`` leaves out special tokens and stop strings."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string), "length", "cancelled" or "error"
    prompt_tokens: int
    time_to_first_token_s: float | None
    seconds: float  # from arrival to the last token
    stop: str | None = None  # the stop string that ended it
    error: str | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first over the time after the first."""
        n = self.completion_tokens
        if self.time_to_first_token_s is None or n < 2:
            return None
        spent = self.seconds - self.time_to_first_token_s
        return (n - 1) / spent if spent > 0 else None

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "token_ids": list(self.token_ids),
            "text": self.text,
            "finish_reason": self.finish_reason,
            "stop": self.stop,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "time_to_first_token_s": self.time_to_first_token_s,
            "tokens_per_s": self.tokens_per_s,
            "seconds": self.seconds,
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class Event:
    """A step's news for one request: ``text`` newly released (may be ''), ``token_id`` the token
    it generated (None on a final event that carries no token), and on the last event
    ``result``."""

    request_id: str
    text: str
    token_id: int | None
    result: GenerationResult | None = None
    index: int = -1  # which generated token this is (0: the first)
    latency_s: float | None = None  # since arrival (the first token) or since the token before

    @property
    def finished(self) -> bool:
        return self.result is not None


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    tokenizer: object
    arrived: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.rng = new_rng(self.params.seed)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.stops = StopMatcher(self.params.stop)
        self._seen = list(self.prompt_ids)

    @property
    def seen(self) -> list[int]:
        """The prompt's and the generated ids (the list itself: read it, do not change it)."""
        return self._seen

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.token_ids)

    def add(self, token_id: int) -> Event:
        """Take the token the model chose; finish when it ends the sequence."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        latency = now - (self.arrived if self.last_token_at is None else self.last_token_at)
        self.last_token_at = now
        self.token_ids.append(token_id)
        self._seen.append(token_id)
        piece = ""
        if token_id in self.eos_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
        else:
            piece = self.stops.add(self.detokenizer.add(token_id))
            if self.stops.stopped is not None:
                self.finish_reason = "stop"
            elif len(self.token_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
        if self.finish_reason is not None and self.stops.stopped is None:
            piece += self.stops.add(self.detokenizer.flush())
            if self.stops.stopped is None:
                piece += self.stops.finish()
            else:
                self.finish_reason = "stop"
        self.text += piece
        result = self.result() if self.finished else None
        return Event(self.request_id, piece, token_id, result, len(self.token_ids) - 1, latency)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def end(self, reason: str, error: str | None = None) -> Event:
        """Finish from outside (cancelled, or a failed step): the last event."""
        self.finish_reason, self.error = reason, error
        return Event(self.request_id, "", None, self.result())

    def result(self) -> GenerationResult:
        last = self.last_token_at if self.last_token_at is not None else time.perf_counter()
        return GenerationResult(
            request_id=self.request_id,
            token_ids=list(self.token_ids),
            text=self.text,
            finish_reason=self.finish_reason or "length",
            prompt_tokens=len(self.prompt_ids),
            time_to_first_token_s=None
            if self.first_token_at is None
            else self.first_token_at - self.arrived,
            seconds=last - self.arrived,
            stop=self.stops.stopped,
            error=self.error,
        )
