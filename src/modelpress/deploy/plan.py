"""Plan a service with the server's own cost in it, and turn the chosen option into settings.

``plan`` measures the model on this CPU (``advisor.measured.measure_curve``), takes the
server's cost per request for one JSON request of this model (``overhead``), and plans every
candidate with it (``advisor.service.plan_service(server_s=...)``). A target nothing can meet gets
one line that says what is possible: the lowest p99 the fastest candidate reaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.advisor.catalog import GPU
from modelpress.advisor.measured import measure_curve, this_machine
from modelpress.advisor.service import (
    NoServiceError,
    ServiceOption,
    ServicePlan,
    plan_service,
    with_server_time,
)
from modelpress.deploy.overhead import ServerCost, answer_bytes, json_body
from modelpress.errors import OptionError
from modelpress.profile.workload import workload_from_onnx
from modelpress.runtime.ort import session
from modelpress.verify.inputs import generate_inputs

QUEUE_SPAN = 2.0  # the queue holds what arrives in this many p99 targets (later answers are late)


@dataclass(frozen=True)
class Sample:
    """One request of the model: its feeds, its JSON body and the size of the JSON answer."""

    feeds: dict[str, np.ndarray]
    body: bytes
    answer_bytes: int

    @property
    def bytes(self) -> int:
        return len(self.body) + self.answer_bytes


def sample_request(
    model: ir.Model, name: str, feeds: dict[str, np.ndarray] | None = None
) -> Sample:
    """One request of batch 1: the first row of ``feeds`` (the user's data), or generated inputs."""
    names = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    if feeds and all(n in feeds for n in names):
        one = {n: np.ascontiguousarray(feeds[n][:1]) for n in names}
    else:
        one = generate_inputs(model, dims={"batch": 1}, default_dim=1)
    outs = session(model, optimize="all").run(None, one)
    outputs = {v.name: np.asarray(o) for v, o in zip(model.graph.outputs, outs, strict=True)}
    return Sample(one, json_body(one), answer_bytes(outputs, name))


def _check_target(qps: float, p99_ms: float) -> None:
    if not qps or qps <= 0:
        raise OptionError(f"`qps` {qps:g}: give the requests per second to serve, above 0")
    if not p99_ms or p99_ms <= 0:
        raise OptionError(f"`p99_ms` {p99_ms:g}: give the latency target in ms, above 0")


def plan(
    model: ir.Model,
    *,
    name: str,
    qps: float,
    p99_ms: float,
    cost: ServerCost,
    sample: Sample,
    gpus: list[GPU] | None = None,
    cpu: bool = True,
    precision: str = "fp32",
    max_batch: int | None = None,
    gpu_notes: dict[str, str] | None = None,
) -> ServicePlan:
    """The service plan of ``model`` on ``gpus`` and (``cpu``) this machine, with the server's
    measured cost per request in every curve (module docstring)."""
    _check_target(qps, p99_ms)
    server_s = cost.seconds(sample.bytes)
    machine = None
    # the request's own shapes size every other dimension (an image's, a sequence's)
    shapes = {k: tuple(v.shape) for k, v in sample.feeds.items()}
    if cpu:
        curve = measure_curve(model, target_s=p99_ms / 1e3, limit=max_batch or 256, shapes=shapes)
        machine = this_machine(curve)
    workload = workload_from_onnx(model, name=name, shapes=shapes)
    try:
        return plan_service(
            workload,
            list(gpus or []),
            qps=qps,
            p99_ms=p99_ms,
            precision=precision,
            machine=machine,
            max_batch=max_batch,
            server_s=server_s,
            server_tail_ms=cost.tail_ms,
            gpu_notes=gpu_notes,
        )
    except NoServiceError:
        if machine is None:
            raise
        # what is possible: a request alone on the fastest candidate, with the server's share
        fastest = float(with_server_time(machine.curve, server_s)(1)) + cost.tail_ms / 1e3
        if fastest * 1e3 < p99_ms:
            raise  # the latency is reachable; the rate is not (the advisor's reasons say why)
        raise NoServiceError(
            f"{name}: p99 {p99_ms:g} ms is below what this machine can answer in: one request takes "
            f"{fastest * 1e3:.3g} ms at its p99 (model {float(machine.curve(1)) * 1e3:.3g} ms + server "
            f"{server_s * 1e3:.3g} ms + its spread {cost.tail_ms:.3g} ms); ask `p99_ms` {_nice(fastest * 1e3 * 2)} or more, or plan on GPUs (`gpus`)"
        ) from None


def _nice(ms: float) -> str:
    return f"{ms:.2g}" if ms < 10 else f"{math.ceil(ms):d}"


def queue_size(option: ServiceOption, *, qps: float, p99_ms: float) -> int:
    """Requests that may wait per replica: what arrives in ``QUEUE_SPAN`` latency targets at the
    replica's rate (a request that waits longer has missed anyway), at least two batches."""
    rate = qps / option.replicas
    return max(8, 2 * option.max_batch, math.ceil(rate * p99_ms / 1e3 * QUEUE_SPAN))


def fewest_replicas(option: ServiceOption, qps: float) -> int:
    """The fewest replicas that carry ``qps`` at their peak throughput (autoscaling's floor)."""
    return max(1, math.ceil(qps / option.curve.peak_throughput))


__all__ = ["Sample", "fewest_replicas", "plan", "queue_size", "sample_request"]
