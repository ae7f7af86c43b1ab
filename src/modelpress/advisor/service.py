"""Plan an online service: how many of each device serve ``qps`` requests at a p99 latency.

For each candidate (catalog GPUs, and this machine's CPU when a service curve was measured):

1. The service curve ``S(b)``: the time one replica takes for a batch of ``b`` (``curve.py``).
   A device whose batch of one already misses the target is rejected.
2. Replicas: ``c`` replicas each receive ``qps / c`` requests per second (a load balancer
   spreading independent requests keeps each stream Poisson; round-robin would be smoother, so
   the plan errs on the safe side). The batches a replica forms and the latency its requests see
   come from the queue analysis of ``batching.py`` (dynamic batching with a max batch and a max
   delay), not from the largest batch that fits. The plan takes the fewest replicas whose p99
   meets the target without saturating (``batching.SATURATION``), first with no batching delay
   (``max_delay = 0``: take whatever waited while the worker was busy), then tries one replica
   fewer with a delay of ``DELAY_STEPS`` × S(1), which can pay off when a batch of one is slow.
3. ``--max-batch``: the smallest power of two at or above the 99.9th percentile of the batch
   sizes the replica forms (a cap that almost never binds, so memory stays bounded and the
   queue behaves as analysed), at most the largest batch that fits; the stats are recomputed
   with it.
4. Cost: replicas × the hourly rate (cloud rental, or owned: the price spread over every hour
   of the device's life, since a service's replicas are provisioned around the clock, plus power
   at TDP, ``cost.py``) over the requests served in an hour.

Options are ranked by their cheapest cost per million requests; unpriced ones follow, fewest
replicas first; rejected devices are listed with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from modelpress.advisor.batching import QueueStats, analyse
from modelpress.advisor.catalog import GPU
from modelpress.advisor.cost import Pricing, cheaper, hourly_rates
from modelpress.advisor.curve import ServiceCurve, estimate_curve
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.errors import ModelpressError, OptionError
from modelpress.profile.workload import Workload

DELAY_STEPS = (0.5, 1.0, 2.0)  # batching delays tried, in units of a batch of one's service time
MAX_REPLICAS = 100_000


class NoServiceError(ModelpressError):
    """No candidate can serve the traffic at the latency target."""


@dataclass(frozen=True)
class Machine:
    """A device option that is not in the catalog: this machine's CPU, with its measured curve
    and its prices (None where unknown)."""

    name: str
    curve: ServiceCurve
    cloud_usd_hr: float | None = None
    own_usd_hr: float | None = None
    price_source: str = ""


@dataclass(frozen=True)
class ServiceOption:
    device: str
    kind: str  # "gpu" or "cpu"
    replicas: int
    max_batch: int
    max_delay_ms: float
    queue: QueueStats  # one replica at qps / replicas
    curve: ServiceCurve
    cloud_usd_per_hour: float | None
    own_usd_per_hour: float | None
    cloud_usd_per_million: float | None
    own_usd_per_million: float | None
    rank: int = 0
    notes: tuple[str, ...] = ()

    @property
    def best_per_million(self) -> float | None:
        return cheaper(self.cloud_usd_per_million, self.own_usd_per_million)

    @property
    def serve_args(self) -> str:
        return f"--max-batch {self.max_batch} --max-delay-ms {_ms(self.max_delay_ms)}"

    def to_dict(self) -> dict:
        q = self.queue
        return {
            **_plain_fields(self, "queue", "curve"),
            "serve_args": self.serve_args,
            "mean_batch": q.mean_batch,
            "p50_ms": q.p50_ms,
            "p99_ms": q.p99_ms,
            "mean_ms": q.mean_ms,
            "utilisation": q.utilisation,
            "queue": q.to_dict(),
            "service_curve": self.curve.to_dict(),
        }


@dataclass(frozen=True)
class ServicePlan:
    workload: str
    qps: float
    p99_ms: float
    precision: str
    options: tuple[ServiceOption, ...]  # ranked
    rejected: tuple[tuple[str, str], ...]  # (device, reason)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {
            **_plain_fields(self, "options", "rejected"),
            "options": [o.to_dict() for o in self.options],
            "rejected": [{"device": d, "reason": r} for d, r in self.rejected],
        }


def _plain_fields(obj, *skip: str) -> dict:
    """A record's fields but ``skip`` as they are (tuples as lists), for ``to_dict``."""
    return {
        f.name: list(v) if isinstance(v := getattr(obj, f.name), tuple) else v
        for f in fields(obj)
        if f.name not in skip
    }


def _ms(value: float) -> str:
    return f"{value:.3g}" if value else "0"


def _feasible(q: QueueStats, target_ms: float) -> bool:
    return not q.saturated and q.p99_ms <= target_ms


def size_replicas(
    curve: ServiceCurve,
    *,
    qps: float,
    p99_ms: float,
    max_batch: int | None = None,
    max_delay_ms: float | None = None,
) -> tuple[int, float, QueueStats] | str:
    """The fewest replicas (and the batching delay) meeting ``p99_ms`` at ``qps``, with the
    queue stats of one replica; or the reason none does. ``max_delay_ms`` given: only that."""
    limit = min(curve.limit, max_batch) if max_batch else curve.limit
    target_s = p99_ms / 1e3
    one = float(curve(1))
    if one >= target_s:
        return f"a batch of one takes {one * 1e3:.3g} ms, over the {p99_ms:g} ms target"
    delays = [max_delay_ms / 1e3] if max_delay_ms is not None else [0.0]

    def at(replicas: int, delay: float) -> QueueStats:
        return analyse(qps / replicas, curve, max_batch=limit, max_delay_s=delay)

    # a replica serves at most its best throughput; start there and double until feasible
    lo = fewest = max(1, math.ceil(qps / curve.peak_throughput))
    hi = lo
    while not _feasible(at(hi, delays[0]), p99_ms):
        if hi >= MAX_REPLICAS:
            return f"needs more than {MAX_REPLICAS} replicas"
        lo, hi = hi + 1, min(MAX_REPLICAS, hi * 2)
    while lo < hi:  # p99 falls as replicas are added: the fewest feasible
        mid = (lo + hi) // 2
        if _feasible(at(mid, delays[0]), p99_ms):
            hi = mid
        else:
            lo = mid + 1
    best = (hi, delays[0], at(hi, delays[0]))
    # one replica fewer with a batching delay: only where it could carry the load (a delay
    # lowers no queue's saturation: it only makes batches larger once the worker is free)
    if max_delay_ms is None and hi - 1 >= fewest and not at(hi - 1, 0.0).saturated:
        for step in DELAY_STEPS:
            delay = step * one
            if delay >= target_s / 2:
                break
            q = at(hi - 1, delay)
            if _feasible(q, p99_ms):
                best = (hi - 1, delay, q)
                break
    return best


def with_server_time(curve: ServiceCurve, server_s: float) -> ServiceCurve:
    """``curve`` plus the server's own time per request: ``S(b) + b · server_s`` (the server
    parses, batches and answers each request of a batch on the same cores as the model)."""
    if server_s <= 0:
        return curve
    return ServiceCurve(
        curve.batches,
        tuple(s + b * server_s for b, s in zip(curve.batches, curve.seconds, strict=True)),
        curve.limit,
        f"{curve.source} + the server's {server_s * 1e3:.3g} ms per request",
    )


def _cap(curve: ServiceCurve, q: QueueStats, max_batch: int | None) -> int:
    """The max batch to configure: the power of two at or above the 99.9th percentile batch."""
    limit = min(curve.limit, max_batch) if max_batch else curve.limit
    return min(limit, 1 << max(0, math.ceil(math.log2(max(q.batch_p999, 1)))))


def plan_option(
    name: str,
    kind: str,
    curve: ServiceCurve,
    *,
    qps: float,
    p99_ms: float,
    rates: tuple[float | None, float | None],
    max_batch: int | None = None,
    max_delay_ms: float | None = None,
    notes: tuple[str, ...] = (),
    tail_ms: float = 0.0,
) -> ServiceOption | str:
    """One device's plan (or the reason it cannot serve): replicas, batching, cost.
    ``tail_ms`` is added to the queue's p99 (``plan_service``'s ``server_tail_ms``)."""
    if tail_ms >= p99_ms:
        return f"the server's own time varies by {tail_ms:.3g} ms at its p99, over the {p99_ms:g} ms target"
    target = p99_ms - tail_ms
    sized = size_replicas(
        curve, qps=qps, p99_ms=target, max_batch=max_batch, max_delay_ms=max_delay_ms
    )
    if isinstance(sized, str):
        return sized
    replicas, delay, q = sized
    cap = _cap(curve, q, max_batch)
    if cap != q.max_batch:
        capped = analyse(qps / replicas, curve, max_batch=cap, max_delay_s=delay)
        if _feasible(capped, target):
            q = capped
    if tail_ms:
        q = replace(q, p99_ms=q.p99_ms + tail_ms)
        notes = (*notes, f"p99 includes the server's measured spread, {tail_ms:.3g} ms")
    cloud, own = (None if r is None else r * replicas for r in rates)
    per_hour = qps * 3600.0

    def per_million(rate):
        return None if rate is None else rate / per_hour * 1e6

    return ServiceOption(
        device=name,
        kind=kind,
        replicas=replicas,
        max_batch=q.max_batch,
        max_delay_ms=delay * 1e3,
        queue=q,
        curve=curve,
        cloud_usd_per_hour=cloud,
        own_usd_per_hour=own,
        cloud_usd_per_million=per_million(cloud),
        own_usd_per_million=per_million(own),
        notes=notes,
    )


def plan_service(
    workload: Workload,
    candidates: list[GPU],
    *,
    qps: float,
    p99_ms: float,
    precision: str,
    machine: Machine | None = None,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    pricing: Pricing | None = None,
    max_batch: int | None = None,
    max_delay_ms: float | None = None,
    engine: str = "compiled",
    gpu_notes: dict[str, str] | None = None,
    # the server's own time per request (HTTP, parsing, batching; measured by deploy.overhead),
    # added to every device's curve as S(b) + b · server_s; and how much more than its median
    # it takes at its 99th percentile (the scheduler, other processes): the queue's p99 must
    # meet the target with it added, and the promised p99 includes it
    server_s: float = 0.0,
    server_tail_ms: float = 0.0,
) -> ServicePlan:
    """Plan the service on every candidate (see the module docstring); ranked options."""
    if qps <= 0:
        raise OptionError("`qps` must be positive")
    if p99_ms <= 0:
        raise OptionError("`p99_ms` must be positive")
    if max_batch is not None and max_batch < 1:
        raise OptionError("`max_batch` must be at least 1")
    if max_delay_ms is not None and max_delay_ms < 0:
        raise OptionError("`max_delay_ms` must be 0 or more")
    pricing = pricing or Pricing()
    # a service's replicas are provisioned all the time: an owned device's price is spread over
    # every hour of its life
    owned_around_the_clock = replace(pricing, utilization=1.0)
    options: list[ServiceOption] = []
    rejected: list[tuple[str, str]] = []
    for gpu in candidates:
        if gpu.peak_tflops(precision) is None:
            rejected.append((gpu.name, f"no {precision} compute figure in the catalog"))
            continue
        curve = estimate_curve(
            workload, gpu, precision=precision, target_s=p99_ms / 1e3, eff=eff, engine=engine
        )
        if curve is None:
            rejected.append((gpu.name, "the model does not fit in its memory"))
            continue
        curve = with_server_time(curve, server_s)
        note = (gpu_notes or {}).get(gpu.name)
        got = plan_option(
            gpu.name,
            "gpu",
            curve,
            qps=qps,
            p99_ms=p99_ms,
            rates=hourly_rates(gpu, 1, owned_around_the_clock),
            max_batch=max_batch,
            max_delay_ms=max_delay_ms,
            notes=(note,) if note else (),
            tail_ms=max(0.0, server_tail_ms),
        )
        (rejected.append((gpu.name, got)) if isinstance(got, str) else options.append(got))
    if machine is not None:
        got = plan_option(
            machine.name,
            "cpu",
            with_server_time(machine.curve, server_s),
            qps=qps,
            p99_ms=p99_ms,
            rates=(machine.cloud_usd_hr, machine.own_usd_hr),
            max_batch=max_batch,
            max_delay_ms=max_delay_ms,
            notes=(machine.price_source,) if machine.price_source else (),
            tail_ms=max(0.0, server_tail_ms),
        )
        (rejected.append((machine.name, got)) if isinstance(got, str) else options.append(got))
    if not options:
        why = "; ".join(f"{d}: {r}" for d, r in rejected[:4])
        raise NoServiceError(
            f"{workload.name}: no candidate serves {qps:g} requests/s at p99 {p99_ms:g} ms ({why}); "
            "raise `p99_ms`, lower the `precision`, or add candidates"
        )

    def key(o: ServiceOption):
        price = o.best_per_million
        return (0, price, o.replicas) if price is not None else (1, o.replicas, o.queue.p99_ms)

    ranked = tuple(replace(o, rank=i) for i, o in enumerate(sorted(options, key=key), start=1))
    return ServicePlan(
        workload=workload.name,
        qps=qps,
        p99_ms=p99_ms,
        precision=precision,
        options=ranked,
        rejected=tuple(rejected),
    )


__all__ = [
    "DELAY_STEPS",
    "Machine",
    "NoServiceError",
    "ServiceOption",
    "ServicePlan",
    "plan_option",
    "plan_service",
    "size_replicas",
    "with_server_time",
]
