"""The settings of a server, under the names the command line uses."""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.errors import OptionError


@dataclass(frozen=True)
class ServeOptions:
    """``max_batch``: rows per model run (1 turns batching off); ``max_delay_ms``: how long an idle
    model waits for a batch to fill while more requests are arriving; ``max_queue``: requests that
    may wait per model before the next gets 503; ``max_body_bytes``: the largest request body (413
    past it); ``api_key``: when set, every call but health needs ``Authorization: Bearer KEY``."""

    max_batch: int = 32
    max_delay_ms: float = 2.0
    max_queue: int = 256
    max_body_bytes: int = 64 * 2**20
    api_key: str | None = None
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0  # at shutdown, how long to wait for accepted requests

    def __post_init__(self) -> None:
        for flag, value in (("--max-batch", self.max_batch), ("--max-queue", self.max_queue)):
            if value < 1:
                raise OptionError(f"{flag} must be at least 1")
        if self.max_delay_ms < 0:
            raise OptionError("--max-delay-ms must not be negative")
        if self.max_body_bytes < 1:
            raise OptionError("--max-body-mb must be positive")
