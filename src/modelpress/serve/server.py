"""Run the app on uvicorn, and shut it down without losing a request.

On SIGTERM (or Ctrl+C) the server:

1. marks itself draining (``/v2/health/ready`` answers 503, so a load balancer stops sending);
2. closes its listening socket (new connections are refused) and idle keep-alive connections;
3. answers every request it has accepted: one whose headers have arrived, including one whose body
   is still arriving, runs to its response (uvicorn lets such a connection finish its exchange);
4. stops the batchers and returns, so the process exits 0.

``drain_timeout_s`` bounds step 3: what is still unanswered then (a client that stopped sending
halfway, a queue longer than the time left) gets a 503 JSON error, and ``ServeResult`` counts it
per model as ``cut``, so the report never says every request was answered when one was not.

Connections go through ``connections.guarded_protocol``: a header deadline, a body deadline (in the
app) and a cap on open connections that slow clients cannot hold.

uvicorn re-raises the signal after its own shutdown, which would make the exit status say the
process was killed; ``_Server`` keeps uvicorn's handlers but not that re-raise. ``drain_timeout_s``
bounds step 3 for clients that stop sending halfway.

While it serves, the interpreter's thread switch interval is 1 ms instead of 5: the model's thread
needs the GIL back after each run, and an event loop that is busy with other requests would
otherwise keep it for up to 5 ms, leaving the model idle that long after every batch.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import uvicorn

from modelpress.errors import OptionError
from modelpress.serve.app import build_app
from modelpress.serve.connections import connection_cap, guarded_protocol, raise_file_limit
from modelpress.serve.options import ServeOptions
from modelpress.serve.repository import Repository

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SWITCH_INTERVAL_S = 0.001


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None] | None = None):
        super().__init__(config)
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        # (no re-raise: a server that drained cleanly exits 0)

    def handle_exit(self, sig, frame) -> None:
        self.config.app.state.server.draining = True
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            self._on_started()


@dataclass
class ServeResult:
    """What a server did between its start and its shutdown, per model."""

    host: str
    port: int
    # per model: name, requests, failures (by status), cut, rows, runs, busy_s
    models: list[dict] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # before any model, by status
    max_connections: int = 0

    @property
    def cut(self) -> int:
        """Requests accepted but cut by the drain timeout (answered 503, not served)."""
        return sum(m.get("cut", 0) for m in self.models)

    def to_dict(self) -> dict:
        return {**asdict(self), "cut": self.cut}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one; read it from getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise OptionError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(
    repository: Repository,
    options: ServeOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_started: Callable[[str, int], None] | None = None,
    log_level: str = "warning",
    llms: list[tuple[str, object]] | None = None,
) -> ServeResult:
    """Serve ``repository`` until SIGTERM or SIGINT, then drain and return what it did.

    ``on_started(host, port)`` is called once the server accepts connections (with the port it
    got, for ``port=0``). ``llms``: decoder LLMs (``(name, LLM)``) on the OpenAI routes."""
    app = build_app(repository, options, llms=llms)
    state = app.state.server
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    max_connections = connection_cap(options.max_connections, raise_file_limit())
    http = guarded_protocol(
        header_timeout_s=options.header_timeout_s,
        max_connections=max_connections,
        on_refused=state.refused,
    )
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=options.drain_timeout_s,
        http=http,
        proxy_headers=False,  # nothing here reads the client's address: no X-Forwarded-* to parse
        server_header=False,  # (and no "server: uvicorn" to write on every answer)
        loop="uvloop" if _has("uvloop") else "asyncio",
    )
    started = (lambda: on_started(host, bound_port)) if on_started else None
    server = _Server(config, on_started=started)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Everything loaded so far (the models, the libraries) lives as long as the server: frozen out
    # of the collector, so that a full collection no longer walks it while requests wait. Measured
    # at concurrency 64 on a small CNN: p99 73 ms -> 15 ms, throughput +20% (docs/serve.md).
    gc.collect()
    gc.freeze()
    try:
        server.run(sockets=[sock])
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)
        sock.close()
    return ServeResult(host, bound_port, state.summary(), state.refusals(), max_connections)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
