"""The same server on Ray Serve: one deployment whose replicas each run the whole app.

Each replica builds the app of ``serve.app`` (the same routes, protocol, checks, batching, raw
items and metrics) around its own sessions, and Ray Serve's HTTP proxy spreads requests over the
replicas. Batching stays the batcher's, inside each replica: Ray's ``@serve.batch`` batches calls
of a handle method, not v2 requests with shapes to keep apart, and it cannot split a batch back
per request when an output is not per row.

Models travel to the replicas as ``ModelProto`` messages through Ray's object store (a protected
model leaves this process decrypted: keep the cluster's object store to machines you trust).
Ray is the ``ray`` extra, imported only here.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.errors import require
from modelpress.ir import from_proto, to_proto
from modelpress.serve.options import ServeOptions
from modelpress.serve.repository import Repository

APP_NAME = "modelpress"


@dataclass
class ModelSource:
    name: str
    model: ir.Model


class _Replica:
    """One Ray Serve replica: sessions for every model, and the app around them."""

    def __init__(self, protos: list, options: ServeOptions, backend: str, device: str):
        import gc
        import sys

        from modelpress.serve.server import SWITCH_INTERVAL_S

        sys.setswitchinterval(SWITCH_INTERVAL_S)  # the replica's process is ours: see server.py

        self.repository = Repository.open(
            [(name, from_proto(proto)) for name, proto in protos], backend=backend, device=device
        )
        self.options = options
        gc.collect()  # the models live as long as the replica: out of the collector (see server.py)
        gc.freeze()

    def __serve_build_asgi_app__(self):
        from modelpress.serve.app import build_app

        return build_app(self.repository, self.options)


@dataclass
class RayDeployment:
    """A running deployment; ``wait()`` blocks until SIGTERM or SIGINT, then shuts it down."""

    host: str
    port: int
    started_ray: bool

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def wait(self) -> None:
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stop.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            while not stop.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown()

    def shutdown(self) -> None:
        """Delete the app (Ray Serve lets each replica finish its requests) and stop Serve; stop
        Ray too when this process started it."""
        import ray
        from ray import serve

        serve.delete(APP_NAME)
        serve.shutdown()
        if self.started_ray:
            ray.shutdown()


def deploy(
    sources: list[ModelSource],
    options: ServeOptions,
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    backend: str = "ort",
    device: str = "auto",
) -> RayDeployment:
    """Deploy ``sources`` on Ray Serve behind its HTTP proxy at ``host:port``.

    Uses the Ray cluster this process is connected to, or the one at ``address``, or starts a local
    one. Returns once the replicas answer."""
    ray = require("ray", extra="ray", purpose="serving on Ray (--ray)")
    serve = require("ray.serve", extra="ray", purpose="serving on Ray (--ray)")

    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level="warning")
        started = True
    serve.start(http_options={"host": host, "port": port})
    app = application(
        sources,
        options,
        replicas=replicas,
        cpus_per_replica=cpus_per_replica,
        backend=backend,
        device=device,
    )
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    return RayDeployment(host, port, started)


def application(
    sources: list[ModelSource],
    options: ServeOptions,
    *,
    replicas: int | None = 1,
    cpus_per_replica: float = 1.0,
    backend: str = "ort",
    device: str = "auto",
):
    """The bound Ray Serve application (deployment ``models``) for ``sources``: what ``deploy``
    runs, and what an application builder returns to ``serve run config.yaml`` (whose
    ``deployments:`` entries may then override the replicas, autoscaling and actor options;
    ``replicas=None`` leaves the count to them)."""
    serve = require("ray.serve", extra="ray", purpose="serving on Ray")
    settings = dict(
        name="models",
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=options.max_queue + options.max_batch,
    )
    if replicas is not None:
        settings["num_replicas"] = replicas
    deployment = serve.deployment(serve.ingress()(_Replica), **settings)
    protos = [(s.name, to_proto(s.model)) for s in sources]
    return deployment.bind(protos, options, backend, device)
