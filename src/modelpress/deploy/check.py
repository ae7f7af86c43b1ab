"""A plan is a promise: serve the model as planned and measure what a replica answers.

``check_option`` serves the model with the option's settings (``process.Served``: the real
server), drives one replica open-loop at its share of the traffic (``load.open_loop``: Poisson
arrivals of the plan's JSON request) and puts the measured p99 and throughput beside the
promise. A plan whose measured p99 is more than ``TOLERANCE`` times its promise is *missed*, with
the reason: requests refused or lost, a server that could not keep up with the rate, or a tail
longer than the queue analysis allows (the usual cause on a shared machine: the client and other
processes take the cores the plan counted on).

Only an option on this machine can be checked here; a GPU option is reported as not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.advisor.service import ServiceOption
from modelpress.deploy.load import LoadResult, http_request, open_loop
from modelpress.deploy.process import Served, ServerSpec

TOLERANCE = 1.25


@dataclass(frozen=True)
class PlanCheck:
    device: str
    replicas: int
    rate: float  # requests per second sent to the one replica measured
    max_batch: int
    max_delay_ms: float
    promised_p99_ms: float
    load: LoadResult
    missed: bool
    reason: str

    @property
    def ratio(self) -> float:
        return self.load.p99_ms / self.promised_p99_ms

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "replicas": self.replicas,
            "rate": self.rate,
            "max_batch": self.max_batch,
            "max_delay_ms": self.max_delay_ms,
            "promised_p99_ms": self.promised_p99_ms,
            "measured_p99_ms": self.load.p99_ms,
            "measured_p50_ms": self.load.p50_ms,
            "measured_throughput": self.load.throughput,
            "ratio": self.ratio,
            "tolerance": TOLERANCE,
            "missed": self.missed,
            "reason": self.reason,
            "load": self.load.to_dict(),
        }


def _verdict(option: ServiceOption, load: LoadResult, rate: float) -> tuple[bool, str]:
    promised = option.queue.p99_ms
    ratio = load.p99_ms / promised
    if ratio <= TOLERANCE:
        return (
            False,
            f"measured p99 {load.p99_ms:.3g} ms is {ratio:.2f}x the promised {promised:.3g} ms",
        )
    if load.failed:
        why = f"{load.failed} of {load.sent} requests were refused or not answered (queue full or timed out)"
    elif load.throughput < 0.95 * load.offered:
        why = (
            f"the replica answered {load.throughput:.4g} requests/s of the {load.offered:.4g} sent: it "
            "could not keep up (the server's cost per request is higher under load than calibrated)"
        )
    else:
        why = (
            f"the tail is longer than the queue analysis allows (p50 {load.p50_ms:.3g} ms against the "
            f"promised {option.queue.p50_ms:.3g} ms): other work on this machine's cores (the load "
            "client runs here too) delays the server"
        )
    return (
        True,
        f"measured p99 {load.p99_ms:.3g} ms is {ratio:.2f}x the promised {promised:.3g} ms: {why}",
    )


def check_option(
    option: ServiceOption,
    *,
    model_path: str,
    name: str,
    body: bytes,
    qps: float,
    max_queue: int,
    key_file: str | None = None,
    key_env: str | None = None,
    max_requests: int = 2000,
    max_seconds: float = 10.0,
    warmup_s: float = 1.0,
    seed: int = 0,
) -> PlanCheck:
    """Serve ``model_path`` as ``option`` plans and measure one replica at ``qps / replicas``."""
    rate = qps / option.replicas
    spec = ServerSpec(
        model=str(model_path),
        name=name,
        max_batch=option.max_batch,
        max_delay_ms=option.max_delay_ms,
        max_queue=max_queue,
        key_file=key_file,
        key_env=key_env,
    )
    request = http_request(f"/v2/models/{name}/infer", body)
    with Served(spec) as port:
        load = open_loop(
            "127.0.0.1",
            port,
            request,
            rate=rate,
            max_requests=max_requests,
            max_seconds=max_seconds,
            warmup_s=warmup_s,
            seed=seed,
        )
    missed, reason = _verdict(option, load, rate)
    return PlanCheck(
        device=option.device,
        replicas=option.replicas,
        rate=rate,
        max_batch=option.max_batch,
        max_delay_ms=option.max_delay_ms,
        promised_p99_ms=option.queue.p99_ms,
        load=load,
        missed=missed,
        reason=reason,
    )


__all__ = ["TOLERANCE", "PlanCheck", "check_option"]
