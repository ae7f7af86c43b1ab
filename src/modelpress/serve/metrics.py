"""Prometheus metrics of a server (``GET /metrics``), one registry per server.

| metric | type | labels | what |
| --- | --- | --- | --- |
| ``modelpress_requests_total`` | counter | model | infer requests received |
| ``modelpress_request_failures_total`` | counter | model, code | requests answered with an error status (model ``_none``: refused before any model: auth, unknown routes, connection limits, header timeouts, malformed HTTP) |
| ``modelpress_requests_cut_total`` | counter | model | infer requests cut by the drain timeout at shutdown (answered 503) |
| ``modelpress_request_duration_seconds`` | histogram | model | receipt of the request to its answer |
| ``modelpress_requests_in_progress`` | gauge | | HTTP infer requests being read, queued or run |
| ``modelpress_request_bytes_held`` | gauge | | request bytes held (being read, decoded, queued or run), against ``--max-pending-mb`` |
| ``modelpress_queue_depth`` | gauge | model | requests waiting for the model |
| ``modelpress_batch_size`` | histogram | model | rows per model run |
| ``modelpress_busy_seconds_total`` | counter | model | time the model spent running |
| ``modelpress_inferences_total`` | counter | model | rows the model ran |

Decoder LLMs (the OpenAI routes) add:

| metric | type | labels | what |
| --- | --- | --- | --- |
| ``modelpress_llm_time_to_first_token_seconds`` | histogram | model | a request's arrival to its first token |
| ``modelpress_llm_inter_token_latency_seconds`` | histogram | model | between two tokens of one request |
| ``modelpress_llm_tokens_per_second`` | histogram | model | each request's decode speed (tokens after the first over the time after it) |
| ``modelpress_llm_generated_tokens_total`` | counter | model | tokens generated (its rate is the server's tokens/s) |
| ``modelpress_llm_prompt_tokens_total`` | counter | model | prompt tokens prefilled |
| ``modelpress_llm_requests_finished_total`` | counter | model, reason | requests ended: stop, length, cancelled (a client gone), error |
| ``modelpress_llm_running_sequences`` | histogram | model | sequences in each decode step |

A registry of its own (not the process-global one) lets several servers, and the tests, live in
one process without clashing names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)


class ModelMetrics:
    """One model's children of the metrics (``Metrics.model``): looked up once, not with
    ``labels()`` (a lock and a dict) on every request."""

    def __init__(self, metrics: Metrics, label: str):
        self.label = label
        self.requests = metrics.requests.labels(label)
        self.latency = metrics.latency.labels(label)
        self.queue_depth = metrics.queue_depth.labels(label)
        self.batch_size = metrics.batch_size.labels(label)
        self.busy = metrics.busy.labels(label)
        self.inferences = metrics.inferences.labels(label)
        self._failures = metrics.failures
        self._failure: dict[int, Counter] = {}

    def failure(self, status: int) -> Counter:
        child = self._failure.get(status)
        if child is None:
            child = self._failure[status] = self._failures.labels(self.label, str(status))
        return child


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, max_batch: int = 64):
        self.registry = CollectorRegistry(auto_describe=True)
        self._models: dict[str, ModelMetrics] = {}
        r = self.registry
        self.requests = Counter(
            "modelpress_requests", "Infer requests received", ["model"], registry=r
        )
        self.failures = Counter(
            "modelpress_request_failures",
            "Requests answered with an error",
            ["model", "code"],
            registry=r,
        )
        self.cut = Counter(
            "modelpress_requests_cut",
            "Infer requests cut by the drain timeout at shutdown",
            ["model"],
            registry=r,
        )
        self.latency = Histogram(
            "modelpress_request_duration_seconds",
            "Time from receiving an infer request to answering it",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_progress = Gauge(
            "modelpress_requests_in_progress",
            "Infer requests being read, queued or run",
            registry=r,
        )
        self.held_bytes = Gauge(
            "modelpress_request_bytes_held",
            "Request bytes held: being read, decoded, queued or run",
            registry=r,
        )
        self.queue_depth = Gauge(
            "modelpress_queue_depth", "Requests waiting for the model", ["model"], registry=r
        )
        sizes, b = [], 1
        while b < max_batch:
            sizes.append(b)
            b *= 2
        self.batch_size = Histogram(
            "modelpress_batch_size",
            "Rows per model run",
            ["model"],
            buckets=(*sizes, max_batch),
            registry=r,
        )
        self.busy = Counter(
            "modelpress_busy_seconds", "Time the model spent running", ["model"], registry=r
        )
        self.inferences = Counter(
            "modelpress_inferences", "Rows the model ran", ["model"], registry=r
        )

    def model(self, label: str) -> ModelMetrics:
        """The metrics of one model label, made on first use."""
        child = self._models.get(label)
        if child is None:
            child = self._models[label] = ModelMetrics(self, label)
        return child

    def add_llm(self) -> None:
        """The metrics of decoder LLMs (created once, when the server holds one)."""
        r = self.registry
        token_buckets = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
        self.ttft = Histogram(
            "modelpress_llm_time_to_first_token_seconds",
            "Time from a request's arrival to its first token",
            ["model"],
            buckets=token_buckets,
            registry=r,
        )
        self.itl = Histogram(
            "modelpress_llm_inter_token_latency_seconds",
            "Time between two tokens of one request",
            ["model"],
            buckets=(0.001, 0.002, 0.005, *token_buckets),
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "modelpress_llm_tokens_per_second",
            "Each request's decode speed",
            ["model"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
            registry=r,
        )
        self.generated = Counter(
            "modelpress_llm_generated_tokens", "Tokens generated", ["model"], registry=r
        )
        self.prompt_tokens = Counter(
            "modelpress_llm_prompt_tokens", "Prompt tokens prefilled", ["model"], registry=r
        )
        self.finished = Counter(
            "modelpress_llm_requests_finished",
            "Generation requests ended, by reason",
            ["model", "reason"],
            registry=r,
        )
        self.running = Histogram(
            "modelpress_llm_running_sequences",
            "Sequences in each decode step",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
