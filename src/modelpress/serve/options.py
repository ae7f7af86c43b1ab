"""The settings of a server, under the names the command line uses."""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.errors import OptionError

MIN_REQUEST_ROWS = 64


@dataclass(frozen=True)
class ServeOptions:
    """``max_batch``: rows per model run (1 turns batching off); ``max_delay_ms``: how long an idle
    model waits for a batch to fill while more requests are arriving; ``max_queue``: requests that
    may wait per model before the next gets 503; ``max_body_bytes``: the largest request body (413
    past it); ``api_key``: when set, every call but health needs ``Authorization: Bearer KEY``.

    What one client may make the server hold: ``max_request_rows`` rows in one request (413 past
    it; None: ``max_batch``, at least 64, so that the biggest run the model makes is one the
    operator chose); ``max_pending_bytes`` of request bodies held at once, being read, decoded,
    waiting or running (503 past it; None: 256 MiB, at least 4 bodies); ``max_connections`` open connections (past it the one that
    has waited longest for its request's headers or body is closed, else the new one gets 503);
    ``header_timeout_s`` for a request's headers to arrive (408, then the connection closes) and
    ``body_timeout_s`` for its body (408).

    Decoder LLMs: ``max_seqs`` sequences generate at once (the rest wait); ``max_context`` tokens
    of prompt and answer at most (None: the model's own); ``prefill_chunk`` prompt tokens a step
    while others generate (the longest a new prompt holds the running streams up)."""

    max_batch: int = 32
    max_delay_ms: float = 2.0
    max_queue: int = 256
    max_body_bytes: int = 64 * 2**20
    api_key: str | None = None
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0  # at shutdown, how long to wait for accepted requests
    max_request_rows: int | None = None
    max_pending_bytes: int | None = None
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_seqs: int = 16
    max_context: int | None = None
    prefill_chunk: int = 256

    def __post_init__(self) -> None:
        for flag, value in (
            ("--max-batch", self.max_batch),
            ("--max-queue", self.max_queue),
            ("--max-connections", self.max_connections),
            ("--max-seqs", self.max_seqs),
            ("--prefill-chunk", self.prefill_chunk),
        ):
            if value < 1:
                raise OptionError(f"{flag} must be at least 1")
        if self.max_context is not None and self.max_context < 1:
            raise OptionError("--max-context must be at least 1")
        if self.max_request_rows is not None and self.max_request_rows < 1:
            raise OptionError("--max-request-rows must be at least 1")
        if self.max_delay_ms < 0:
            raise OptionError("--max-delay-ms must not be negative")
        if self.max_body_bytes < 1:
            raise OptionError("--max-body-mb must be positive")
        if self.max_pending_bytes is not None and self.max_pending_bytes < self.max_body_bytes:
            raise OptionError("--max-pending-mb must be at least --max-body-mb")
        for flag, value in (
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
            ("--drain-timeout", self.drain_timeout_s),
        ):
            if value <= 0:
                raise OptionError(f"{flag} must be positive")

    @property
    def request_rows(self) -> int:
        """The most rows one request may bring."""
        if self.max_request_rows is not None:
            return self.max_request_rows
        return max(self.max_batch, MIN_REQUEST_ROWS)

    @property
    def pending_bytes(self) -> int:
        """The most request bytes the server holds at once."""
        if self.max_pending_bytes is not None:
            return self.max_pending_bytes
        return max(256 * 2**20, 4 * self.max_body_bytes)
