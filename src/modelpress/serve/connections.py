"""Connections that slow or idle clients cannot pile up: uvicorn's HTTP protocol with a header
timeout and a connection cap.

uvicorn (0.54) bounds a keep-alive connection's idle time (``timeout_keep_alive``), but that
timer restarts with every byte, so a client that sends its headers a byte at a time holds its
connection forever; and ``limit_concurrency`` answers 503 only once a request's headers are complete,
so connections that never complete them are never refused. Hypercorn has a ``read_timeout`` but
is pure Python (slower per request) and granian's timeouts are for idle HTTP/2; neither is
installed with modelpress. So the server keeps uvicorn and its httptools parser and adds, per
connection:

- a header deadline: from the moment a connection opens, or its previous answer is sent, the next
  request's headers must be complete within ``header_timeout_s``, bytes or no bytes; past it the
  client gets a 408 (JSON) and the connection closes;
- a cap on open connections: when one more opens past ``max_connections``, the connection that has
  waited longest for a request's headers, or for the rest of a body, is closed to make room (a
  client that sends a whole request at once is never the one waiting); only when no connection is
  waiting does the newcomer get a 503 and close.

The body's own deadline is the app's (``app.read_body``: a 408 that the metrics count). Every
refusal here is counted through ``on_refused(status)`` and is a JSON body, like the app's errors.
The cap stays below the process's open-file limit (which the server raises to its hard limit), so
``accept`` never fails for lack of descriptors.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_RESERVED_FILES = 64  # descriptors kept for the models, logs and the runtime's own files


def raise_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(wanted: int, file_limit: int) -> int:
    """``wanted``, kept below what the open-file limit allows."""
    return max(1, min(wanted, file_limit - _RESERVED_FILES))


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(
    *,
    header_timeout_s: float,
    max_connections: int,
    on_refused: Callable[[int], None] = lambda status: None,
) -> type[HttpToolsProtocol]:
    """An httptools protocol class with these limits, for ``uvicorn.Config(http=...)``."""
    # the connections waiting for a request's headers or body, longest-waiting first (a dict
    # keeps insertion order): finding the one to close is O(1), even in a burst of connections
    waiting: dict[HttpToolsProtocol, None] = {}

    class GuardedProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._await_headers()
            if len(self.connections) > max_connections and not self._make_room():
                self._refuse(
                    503,
                    "Service Unavailable",
                    f"the server has {max_connections} connections open: retry later",
                )

        def _await_headers(self) -> None:
            self._wait()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _wait(self) -> None:
            waiting.pop(self, None)
            waiting[self] = None

        def _done_waiting(self) -> None:
            waiting.pop(self, None)

        def _make_room(self) -> bool:
            victim = next((c for c in waiting if c is not self), None)
            if victim is None:
                return False
            victim._refuse(
                408,
                "Request Timeout",
                "closed to make room: the server is at its connection limit and this request "
                "was the slowest to arrive",
            )
            return True

        def _refuse(self, status: int, reason: str, message: str) -> None:
            self._stop_timer()
            self._done_waiting()
            idle = self.cycle is None or self.cycle.response_complete
            if idle:  # else the app counts it: its request ends with the client gone (499)
                on_refused(status)
            if not self.transport.is_closing():
                if idle or not self.cycle.response_started:
                    self.transport.write(_response(status, reason, message))
                if not idle:
                    self.cycle.disconnected = True  # the app's answer, if any, goes nowhere
                self.transport.close()

        def _headers_late(self) -> None:
            self._header_timer = None
            self._refuse(
                408,
                "Request Timeout",
                f"the request's headers did not arrive within {header_timeout_s:g} s",
            )

        def _stop_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def on_headers_complete(self) -> None:
            self._stop_timer()
            # a request with a body keeps waiting (for the body) until on_message_complete
            has_body = any(
                name in (b"content-length", b"transfer-encoding") and value not in (b"0",)
                for name, value in self.headers
            )
            if has_body:
                self._wait()
            else:
                self._done_waiting()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._done_waiting()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            self._done_waiting()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # httptools could not parse the request (a malformed line or header): JSON, counted
            self._stop_timer()
            self._done_waiting()
            on_refused(400)
            self.transport.write(
                _response(400, "Bad Request", f"the HTTP request is malformed: {msg}")
            )
            self.transport.close()

    return GuardedProtocol
