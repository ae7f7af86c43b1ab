"""Connections that slow or idle clients cannot pile up: uvicorn's HTTP protocol with a header
timeout and a connection cap.

uvicorn (0.54) bounds a keep-alive connection's idle time (``timeout_keep_alive``), but that
timer restarts with every byte, so a client that sends its headers a byte at a time holds its
connection forever; and ``limit_concurrency`` answers 503 only once a request's headers are complete,
so connections that never complete them are never refused. Hypercorn has a ``read_timeout`` but
is pure Python (slower per request) and granian's timeouts are for idle HTTP/2; neither is
installed with modelpress. So the server keeps uvicorn and its httptools parser and adds, per
connection:

- a header deadline: from the moment a connection opens, or the first byte of its next request
  arrives, the request's headers must be complete within ``header_timeout_s``; past it the client
  gets a 408 (JSON) and the connection closes. A keep-alive connection on which no byte came
  since its last answer is closed without a word after uvicorn's ``timeout_keep_alive`` (or the
  header deadline, if shorter), as uvicorn closes idle ones: a client reusing it would read a
  408 as the answer to its next request;
- a cap on open connections: when one more opens past ``max_connections``, the connection that has
  waited longest for a request's headers, or for the rest of a body, is closed to make room (a
  client that sends a whole request at once is never the one waiting); only when no connection is
  waiting does the newcomer get a 503 and close.

Deadlines cost no timer per request: uvloop's ``call_later`` with its ``cancel`` takes about 7 µs
of the event loop (measured here; a bare coroutine call takes 0.3), and a keep-alive connection
would make two per request (uvicorn's keep-alive wait and the header deadline). Instead the
connections waiting for headers sit in two dicts (idle, and begun), each in the order its waits
began, and one sweep, every eighth of the shortest deadline (at most a second), closes the ones
at their fronts whose time is up: reading only those, it costs nothing for the hundreds of slow
connections of an attack that are not due yet. A deadline is kept to within an eighth of itself.

The body's own deadline is the app's (``body.receive_body``: a 408 that the metrics count),
armed only for a body that had not all arrived with its headers (``body_arrived``). Every
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
BODY_ARRIVED = "modelpress.body_arrived"  # in scope["extensions"]: see body_arrived
COALESCE_BYTES = 64 * 1024  # writes up to this wait for the end of the loop's turn (_Coalescing)


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


class _Coalescing:
    """A connection's transport whose small writes within one turn of the event loop go out as
    one: uvicorn writes an answer's head and its body apart, which costs a second system call
    and gives the client two segments to read. Writes keep their order; a large write, a close
    and the end of the turn send what is held first."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if len(data) > COALESCE_BYTES:
            self.flush()
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, []
            if not self._transport.is_closing():
                self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str):  # the rest of the transport's interface, as it is
        return getattr(self._transport, name)


def body_arrived(scope) -> bool:
    """True when the request's whole body had arrived by the time its headers were parsed (its
    reader needs no deadline then)."""
    return BODY_ARRIVED in scope.get("extensions", ())


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
    # the waits for headers, by the loop time each began, in that order (so a sweep reads only
    # the front): keep-alive connections idle since their last answer, and connections whose
    # request has begun (or that are new)
    idle: dict[HttpToolsProtocol, float] = {}
    begun: dict[HttpToolsProtocol, float] = {}
    sweep: list[asyncio.TimerHandle | None] = [None]

    class GuardedProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self.transport = _Coalescing(transport, self.loop)
            self._wait()
            self._await(begun)  # a new connection owes its headers: 408 when late
            if len(self.connections) > max_connections and not self._make_room():
                self._refuse(
                    503,
                    "Service Unavailable",
                    f"the server has {max_connections} connections open: retry later",
                )

        def _await(self, waits: dict[HttpToolsProtocol, float]) -> None:
            idle.pop(self, None)
            begun.pop(self, None)
            waits[self] = self.loop.time()
            if sweep[0] is None:
                sweep[0] = self.loop.call_later(_tick(self), _sweep, self.loop, self)

        def _wait(self) -> None:
            waiting.pop(self, None)
            waiting[self] = None

        def _done_waiting(self) -> None:
            waiting.pop(self, None)
            idle.pop(self, None)
            begun.pop(self, None)

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
            self._done_waiting()
            between = self.cycle is None or self.cycle.response_complete  # no request running
            if between:  # else the app counts it: its request ends with the client gone (499)
                on_refused(status)
            if not self.transport.is_closing():
                if between or not self.cycle.response_started:
                    self.transport.write(_response(status, reason, message))
                if not between:
                    self.cycle.disconnected = True  # the app's answer, if any, goes nowhere
                self.transport.close()

        def _close_idle(self) -> None:
            self._done_waiting()  # nothing to answer: closed as uvicorn closes idle connections
            if not self.transport.is_closing():
                self.transport.close()

        def _headers_late(self) -> None:
            self._refuse(
                408,
                "Request Timeout",
                f"the request's headers did not arrive within {header_timeout_s:g} s",
            )

        def data_received(self, data: bytes) -> None:
            if self in idle:  # the next request has begun: its headers are due from now
                self._await(begun)
            super().data_received(data)

        def on_headers_complete(self) -> None:
            begun.pop(self, None)
            # a request with a body keeps waiting (for the body) until on_message_complete
            has_body = any(
                name in (b"content-length", b"transfer-encoding") and value not in (b"0",)
                for name, value in self.headers
            )
            if has_body:
                self._wait()
            else:
                waiting.pop(self, None)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            waiting.pop(self, None)
            super().on_message_complete()
            if self.scope.get("type") == "http":  # (a parsed request: not an upgrade)
                self.scope.setdefault("extensions", {})[BODY_ARRIVED] = True

        def on_response_complete(self) -> None:
            # uvicorn's own, except for the keep-alive wait: one timer per connection and
            # request costs the event loop more than the rest of this method (uvloop's
            # call_later), so the sweep below closes idle connections instead
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._wait()
                self._await(idle)

        def connection_lost(self, exc: Exception | None) -> None:
            self._done_waiting()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # httptools could not parse the request (a malformed line or header): JSON, counted
            self._done_waiting()
            on_refused(400)
            self.transport.write(
                _response(400, "Bad Request", f"the HTTP request is malformed: {msg}")
            )
            self.transport.close()

    def _tick(proto: HttpToolsProtocol) -> float:
        """How often the sweep runs: a deadline is kept to within an eighth of itself."""
        return min(1.0, min(header_timeout_s, proto.timeout_keep_alive) / 8)

    def _over(waits: dict[HttpToolsProtocol, float], deadline: float) -> list[HttpToolsProtocol]:
        """The connections at the front of ``waits`` that began waiting before ``deadline``."""
        out = []
        for proto, since in waits.items():
            if since > deadline:
                break  # every later wait began later
            out.append(proto)
        return out

    def _sweep(loop: asyncio.AbstractEventLoop, some: HttpToolsProtocol) -> None:
        """Close the connections whose wait is over, then come back in a tick."""
        sweep[0] = None
        now = loop.time()
        keep_alive_s = min(some.timeout_keep_alive, header_timeout_s)
        for proto in _over(idle, now - keep_alive_s):
            proto._close_idle()
        for proto in _over(begun, now - header_timeout_s):
            proto._headers_late()
        if idle or begun:
            sweep[0] = loop.call_later(_tick(some), _sweep, loop, some)

    return GuardedProtocol
