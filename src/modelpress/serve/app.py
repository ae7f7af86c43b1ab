"""The Open Inference Protocol (KServe v2) as a FastAPI app, with Triton's extensions.

| route | answer |
| --- | --- |
| ``GET /v2/health/live``, ``/v2/health/ready`` | 200 (ready: 503 while draining at shutdown); no key needed |
| ``GET /v2`` | server metadata and extensions |
| ``GET /v2/models/{name}[/versions/{v}]`` | model metadata: inputs and outputs with datatypes and shapes |
| ``GET /v2/models/{name}[/versions/{v}]/ready`` | 200, or 404 for an unknown model |
| ``GET /v2/models/{name}[/versions/{v}]/config`` | Triton's model configuration |
| ``POST /v2/models/{name}[/versions/{v}]/infer`` | inference: JSON or binary tensors, or raw items for a model that declares processing |
| ``POST /v2/repository/index`` | the models served |
| ``GET /metrics`` | Prometheus metrics |

Statuses: 400 a malformed request or a wrong input name, datatype or shape (the message names the
input and what the model expects); 401 a missing or wrong key; 404 an unknown model; 408 a body
that did not arrive in time; 413 a body or a request over the limits; 503 a full queue or a
server holding as many request bytes as it may (with ``Retry-After``), or a request cut at
shutdown; 500 a model that failed on a request. Error bodies are ``{"error": message}``, every
one of them counted in ``modelpress_request_failures_total``; an unexpected exception is a JSON
500 whose details go to the log (``errors.logged``), not to the client.

Handlers read and write bytes themselves (no pydantic on the hot path): the server's own cost per
request is what the batching must not eat. The infer route goes further: ``_App`` hands its
requests to ``infer_route.InferRoute`` before FastAPI's middleware stack and router (the same
answers, a fifth less of the event loop's time per request). Bodies over ``INLINE_BYTES`` are
decoded, and answers over it encoded, on a thread, so that one big request does not hold the
event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from modelpress.serve import auth
from modelpress.serve.batcher import Batcher
from modelpress.serve.errors import RequestError, logged
from modelpress.serve.infer_route import (
    INLINE_BYTES,
    InferRoute,
    error_answer,
    infer_target,
    key_refusal,
)
from modelpress.serve.metrics import Metrics
from modelpress.serve.options import ServeOptions
from modelpress.serve.repository import Repository, ServedModel

SERVER_NAME = "modelpress"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]
__all__ = ["INLINE_BYTES", "ServerState", "build_app"]
NO_MODEL = "_none"  # the model label of errors that concern no model (auth, routes, connections)


class ServerState:
    """What the routes share: the models, their batchers, the metrics, and the draining flag."""

    def __init__(self, repository: Repository, options: ServeOptions, metrics: Metrics):
        self.repository = repository
        self.options = options
        self.metrics = metrics
        self.draining = False
        # infer requests being read or decoded, by when they started (see Batcher: max_delay)
        self.receiving: dict[int, float] = {}
        self.active = 0  # infer requests inside a handler
        self.held_bytes = 0  # request bytes held: bodies being read, decoded, queued or run
        self.infer_active = 0  # of them, on the infer route
        # gauges read when scraped, not set on every request
        metrics.held_bytes.set_function(lambda: self.held_bytes)
        metrics.in_progress.set_function(lambda: self.infer_active)
        self.coder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="decode")
        self.llms: dict = {}  # name -> openai_routes.LLMService
        self.batchers = {
            name: Batcher(
                name,
                model.run,
                max_batch=options.max_batch,
                max_delay_s=options.max_delay_ms / 1000,
                max_queue=options.max_queue,
                metrics=metrics,
                arriving=self.arriving,
            )
            for name, model in repository.models.items()
        }

    async def close(self) -> None:
        # requests cut at the drain deadline are answering their 503 now: let them finish first
        for _ in range(100):
            if not self.active:
                break
            await asyncio.sleep(0.01)
        for batcher in self.batchers.values():
            await batcher.close()
        self.coder.shutdown(wait=False)

    def arriving(self) -> int:
        """Requests on their way in that started within the batching delay: one that has taken
        longer (a slow sender) is not worth holding a batch for."""
        horizon = time.perf_counter() - self.options.max_delay_ms / 1000
        count = 0
        for started in reversed(self.receiving.values()):  # newest first
            if started <= horizon:
                break
            count += 1
        return count

    def cut(self, label: str) -> RequestError:
        """The answer to a request that uvicorn cancelled at ``--drain-timeout`` (call it in the
        handler's ``except CancelledError`` while draining): counted as cut, not answered."""
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            task.uncancel()  # the handler goes on, to send this answer
        self.metrics.failures.labels(label, "503").inc()
        self.metrics.cut.labels(label).inc()
        return RequestError(
            503,
            "the server shut down before answering this request (--drain-timeout "
            f"{self.options.drain_timeout_s:g} s)",
            headers={"connection": "close"},
        )

    def refused(self, status: int) -> None:
        """Count an error answered outside the infer route (the connection layer, auth, routes)."""
        self.metrics.failures.labels(NO_MODEL, str(status)).inc()

    def refusals(self) -> dict[str, int]:
        """Errors answered before any model (auth, routes, connection limits), by status."""
        out = {}
        for metric in self.metrics.registry.collect():
            if metric.name == "modelpress_request_failures":
                for sample in metric.samples:
                    if sample.name.endswith("_total") and sample.labels["model"] == NO_MODEL:
                        out[sample.labels["code"]] = int(sample.value)
        return out

    def summary(self) -> list[dict]:
        """Per model: requests received, failed (by status), rows and runs of the model, busy time."""
        value = self.metrics.registry.get_sample_value
        out = []
        for name in [*self.repository.models, *self.llms]:
            failures = {}
            for metric in self.metrics.registry.collect():
                if metric.name == "modelpress_request_failures":
                    for sample in metric.samples:
                        if sample.name.endswith("_total") and sample.labels.get("model") == name:
                            failures[sample.labels["code"]] = int(sample.value)
            out.append(
                {
                    "name": name,
                    "requests": int(value("modelpress_requests_total", {"model": name}) or 0),
                    "failures": failures,
                    "cut": int(value("modelpress_requests_cut_total", {"model": name}) or 0),
                    "rows": int(value("modelpress_inferences_total", {"model": name}) or 0),
                    "runs": int(value("modelpress_batch_size_count", {"model": name}) or 0),
                    "busy_s": round(
                        value("modelpress_busy_seconds_total", {"model": name}) or 0.0, 3
                    ),
                }
            )
            if name in self.llms:  # a decoder: tokens and steps instead of rows and runs
                stats = self.llms[name].scheduler.stats()
                out[-1].update(
                    rows=stats["completion_tokens"],
                    runs=stats["decode_steps"],
                    busy_s=round(stats["decode_seconds"], 3),
                    llm=True,
                )
        return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelpress")
    except PackageNotFoundError:  # running from a source tree
        return "unknown"


def _json(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        json.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def _error(exc: RequestError) -> Response:
    status, headers, body = error_answer(exc)
    response = Response(body, status_code=status)
    response.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
    return response


class _App(FastAPI):
    """FastAPI with the infer route in front of its middleware stack (see ``infer_route``)."""

    infer_route: InferRoute | None = None

    async def __call__(self, scope, receive, send) -> None:
        route = self.infer_route
        if route is not None and scope["type"] == "http" and scope["method"] == "POST":
            path, root = scope["path"], scope.get("root_path")
            if root and path.startswith(root):  # mounted under a prefix: route on the rest
                path = path[len(root) :]
            target = infer_target(path)
            if target is not None:
                await route(scope, receive, send, *target)
                return
        await super().__call__(scope, receive, send)


def build_app(
    repository: Repository,
    options: ServeOptions | None = None,
    *,
    llms: list[tuple[str, object]] | None = None,
) -> FastAPI:
    """The app serving ``repository``, and the decoder ``llms`` (``(name, LLM)`` pairs from
    ``runtime.generate.open_llm``) on the OpenAI routes (``openai_routes``); batchers start with
    the first request, LLM schedulers with the app, and both stop when the app's lifespan ends
    (after the server has answered every request it accepted)."""
    options = options or ServeOptions()
    state = ServerState(repository, options, Metrics(max_batch=options.max_batch))
    services = {}
    if llms:
        from modelpress.serve import openai_routes

        services = openai_routes.open_services(llms, options, state.metrics)
        state.llms = services

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for service in services.values():
            service.scheduler.start()
        yield
        await state.close()
        for service in services.values():
            await asyncio.get_running_loop().run_in_executor(None, service.scheduler.close)

    app = _App(
        title=SERVER_NAME, docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.server = state
    if options.api_key:
        app.add_middleware(KeyGuard, key=options.api_key, on_refused=state.refused)
    if services:
        openai_routes.add_routes(app, state, services)

    route = InferRoute(state)
    app.infer_route = route

    async def infer(request: Request) -> Response:
        # what FastAPI routes here: an infer request that did not take the app's fast path
        name, version = request.path_params["name"], request.path_params.get("version")
        status, headers, body = await route.answer(request.scope, request.receive, name, version)
        response = Response(body, status_code=status)
        response.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        return response

    app.add_route("/v2/models/{name}/infer", infer, methods=["POST"], include_in_schema=False)
    app.add_route(
        "/v2/models/{name}/versions/{version}/infer",
        infer,
        methods=["POST"],
        include_in_schema=False,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        state.refused(exc.status_code)
        return _error(RequestError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        ref = logged(f"{request.url.path} raised: {exc!r}")
        state.refused(500)
        return _error(RequestError(500, f"internal error (server log #{ref})"))

    @app.get("/v2/health/live")
    async def live() -> Response:
        return _json({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        if state.draining:
            return _json({"ready": False}, status=503)
        return _json({"ready": True})

    @app.get("/v2")
    async def server_metadata() -> Response:
        return _json({"name": SERVER_NAME, "version": _version(), "extensions": EXTENSIONS})

    def _model(name: str, version: str | None) -> ServedModel:
        return repository.get(name, version)

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> Response:
        try:
            return _json(_model(name, version).metadata())
        except RequestError as exc:
            return _error(exc)

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        try:
            _model(name, version)
        except RequestError as exc:
            return _error(exc)
        return _json(
            {"name": name, "ready": not state.draining}, status=503 if state.draining else 200
        )

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str | None = None) -> Response:
        try:
            return _json(_model(name, version).config(max_batch=options.max_batch))
        except RequestError as exc:
            return _error(exc)

    @app.post("/v2/repository/index")
    async def repository_index() -> Response:
        return _json(repository.index())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    return app


class KeyGuard:
    """ASGI middleware: refuse (401) every HTTP call but health without the bearer key, before
    the body is read."""

    def __init__(self, app, key: str, on_refused=lambda status: None):
        self.app = app
        self.key = key
        self.on_refused = on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in auth.OPEN_PATHS:
            refusal = key_refusal(self.key, scope["headers"])
            if refusal is not None:
                self.on_refused(401)
                await _error(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
