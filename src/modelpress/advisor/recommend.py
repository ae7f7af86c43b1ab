"""Ranked device recommendations for a workload, one scenario at a time.

Scenarios (``scenario_for`` picks one from the request):

- ``training``: the per-device batch given, or the largest that fits (at most ``BATCH_CAP``);
  ranked by cost per million samples/tokens (or of the whole job when its size is given).
- ``online``: inference under a latency target, traffic unknown: the largest batch (at most
  ``BATCH_CAP``) whose service time fits twice in the target, since a request that arrives just
  after a batch left waits for that batch and then for its own; ranked by cost per million
  inferences at that batch. With a request rate, ``service.plan_service`` (``advise --qps``)
  models the batches the traffic actually forms.
- ``batch``: offline inference at the batch given or the largest that fits; ranked by cost per
  million.
- ``edge``: inference on devices whose TDP is within a power cap (under the latency target if one
  is given); ranked by throughput.

A device that cannot run the request (does not fit, misses the target, over the cap, lacks the
precision) is listed after the ranked ones with the reason. When no device can run it,
``recommend`` raises ``NoViableDeviceError`` saying what would have to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from modelpress.advisor.catalog import GPU
from modelpress.advisor.cost import Cost, Pricing, cost_of
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import Estimate, best_under_latency, estimate
from modelpress.advisor.memory import Footprint
from modelpress.errors import ModelpressError, OptionError
from modelpress.profile.workload import Workload

SCENARIOS = ("training", "online", "batch", "edge")
BATCH_CAP = 256


class NoViableDeviceError(ModelpressError):
    """No candidate device can run the request as asked."""


@dataclass(frozen=True)
class Request:
    task: str
    precision: str
    batch: int | None = None
    num_gpus: int = 1
    latency_ms: float | None = None
    power_cap_w: float | None = None
    amount: float | None = None  # samples or tokens to process (training job size)
    optimizer: str = "adam"
    engine: str = "compiled"  # inference on a compiled engine or eager PyTorch (estimate.ENGINES)


@dataclass(frozen=True)
class Ranked:
    rank: int | None  # None: cannot run the request
    gpu: GPU
    estimate: Estimate | None
    cost: Cost | None
    reason: str

    def to_dict(self) -> dict:
        d: dict = {"rank": self.rank, "gpu": self.gpu.name, "reason": self.reason}
        if self.estimate is not None:
            d.update(self.estimate.to_dict())
        else:
            d.update(
                num_gpus=None,
                fits=False,
                memory_gb=None,
                throughput=None,
                unit=None,
                latency_ms=None,
                bound=None,
            )
        d["cost"] = self.cost.to_dict() if self.cost else None
        if self.cost:
            d.update({k: v for k, v in self.cost.to_dict().items()})
        return d


@dataclass(frozen=True)
class Recommendation:
    scenario: str
    workload: str
    request: Request
    rows: tuple[Ranked, ...]

    @property
    def ranked(self) -> list[Ranked]:
        return [r for r in self.rows if r.rank is not None]


def scenario_for(req: Request) -> str:
    if req.task == "train":
        return "training"
    if req.power_cap_w is not None:
        return "edge"
    return "online" if req.latency_ms is not None else "batch"


def _evaluate(
    workload: Workload, gpu: GPU, req: Request, scenario: str, eff: Efficiency, pricing: Pricing
) -> Ranked:
    n = req.num_gpus
    if scenario == "edge" and (gpu.tdp_w is None or gpu.tdp_w * n > req.power_cap_w):
        power = "no power figure" if gpu.tdp_w is None else f"TDP {gpu.tdp_w * n:g} W"
        return Ranked(None, gpu, None, None, f"{power}: over the {req.power_cap_w:g} W cap")
    if gpu.peak_tflops(req.precision) is None:
        return Ranked(None, gpu, None, None, f"no {req.precision} compute figure in the catalog")
    if n > 1 and gpu.link_gbs(n) is None:
        return Ranked(None, gpu, None, None, f"no interconnect figure for {n} devices")
    run = partial(
        estimate, workload, gpu, precision=req.precision, num_gpus=n, eff=eff, engine=req.engine
    )
    if req.latency_ms is not None and req.task == "infer":
        est = best_under_latency(
            workload,
            gpu,
            latency_ms=req.latency_ms / 2,
            precision=req.precision,
            num_gpus=n,
            eff=eff,
            cap=BATCH_CAP,
            engine=req.engine,
        )
        if est is not None and req.batch and est.batch > req.batch:
            est = run(task="infer", batch=req.batch)
        if est is None:
            one = run(task="infer", batch=1)
            why = (
                one.notes[-1]
                if not one.fits
                else f"misses {req.latency_ms:g} ms even at batch 1 (twice {one.latency_ms:.3g} ms: "
                "the batch in flight, then its own)"
            )
            return Ranked(None, gpu, one, None, why)
    else:
        held = Footprint(workload, req.task, req.precision, req.optimizer)
        top = held.max_batch(gpu.memory_gb, num_gpus=n)
        batch = req.batch or max(1, min(top, BATCH_CAP))
        est = run(task=req.task, batch=batch, optimizer=req.optimizer)
    if not est.fits:
        return Ranked(
            None,
            gpu,
            est,
            None,
            f"does not fit: needs {est.memory_gb:.1f} GB per device, has {gpu.memory_gb:g} GB",
        )
    # online inference: a request may wait for the batch in flight, then for its own
    waits = 2 if req.task == "infer" else 1
    if req.latency_ms is not None and waits * est.latency_ms > req.latency_ms:
        return Ranked(
            None,
            gpu,
            est,
            None,
            f"misses {req.latency_ms:g} ms at batch {est.batch} ({waits} x {est.latency_ms:.3g} ms)"
            if waits > 1
            else f"misses {req.latency_ms:g} ms at batch {est.batch} ({est.latency_ms:.3g} ms)",
        )
    cost = cost_of(gpu, n, throughput=est.throughput, pricing=pricing, amount=req.amount)
    price = cost.best_per_million
    source = "cloud" if price is not None and price == cost.cloud_usd_per_million else "owned"
    priced = (
        f"${price:.3g} per million ({source})" if price is not None else "no price in the catalog"
    )
    reason = (
        f"fits ({est.memory_gb:.1f} of {gpu.memory_gb:g} GB), {est.bound}-bound at batch {est.batch}, "
        f"{est.throughput:.4g} {est.unit}, {priced}"
    )
    return Ranked(0, gpu, est, cost, reason)


def recommend(
    workload: Workload,
    candidates: list[GPU],
    req: Request,
    *,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    pricing: Pricing | None = None,
) -> Recommendation:
    """Evaluate every candidate and rank those that can run the request."""
    pricing = pricing or Pricing()
    if not candidates:
        raise OptionError("no candidate devices")
    if req.task not in ("train", "infer"):
        raise OptionError(f"`task` {req.task!r}: choose train or infer")
    if req.latency_ms is not None and req.latency_ms <= 0:
        raise OptionError("`latency_ms` must be positive")
    scenario = scenario_for(req)
    rows = [_evaluate(workload, g, req, scenario, eff, pricing) for g in candidates]
    viable = [r for r in rows if r.rank is not None]
    if not viable:
        raise NoViableDeviceError(_why_none(workload, candidates, req, scenario, rows))

    def key(r: Ranked):
        if scenario == "edge":
            return (0, -r.estimate.throughput)
        price = r.cost.best_job_usd if req.amount else r.cost.best_per_million
        # priced devices first, cheapest first; unpriced ones by throughput
        return (
            (0, price, -r.estimate.throughput)
            if price is not None
            else (1, 0.0, -r.estimate.throughput)
        )

    viable.sort(key=key)
    ranked = []
    for i, r in enumerate(viable, start=1):
        if i == 1:
            lead = (
                "fastest within the power cap"
                if scenario == "edge"
                else "cheapest per unit of work"
            )
        else:
            lead = (
                "slower"
                if scenario == "edge"
                else "costlier per unit of work"
                if key(r)[0] == 0
                else "unpriced"
            )
        ranked.append(Ranked(i, r.gpu, r.estimate, r.cost, f"{lead}: {r.reason}"))
    rest = [r for r in rows if r.rank is None]
    return Recommendation(scenario, workload.name, req, tuple(ranked + rest))


def _why_none(
    workload: Workload, candidates: list[GPU], req: Request, scenario: str, rows: list[Ranked]
) -> str:
    what = f"{workload.name} ({req.task}, {req.precision}"
    what += f", {req.num_gpus} devices)" if req.num_gpus > 1 else ")"
    if all(r.estimate is not None and not r.estimate.fits for r in rows):
        held = Footprint(workload, req.task, req.precision, req.optimizer)
        need = held.bytes(req.batch or 1) / 1e9
        biggest = max(g.memory_gb for g in candidates)
        return (
            f"{what} fits on none of the {len(candidates)} candidate devices: it needs about {need:.1f} GB "
            f"at batch {req.batch or 1} and the largest has {biggest:g} GB; try more --num-gpus, a lower "
            "--precision or a smaller --batch"
        )
    if scenario == "edge" and all(r.estimate is None for r in rows):
        return f"{what}: no candidate device is within the {req.power_cap_w:g} W power cap"
    if req.latency_ms is not None:
        timed = [r for r in rows if r.estimate is not None and r.estimate.fits]
        if timed:
            best = min(timed, key=lambda r: r.estimate.latency_ms)
            return (
                f"{what}: no device meets --latency-ms {req.latency_ms:g}; the fastest, {best.gpu.name}, "
                f"needs {best.estimate.latency_ms:.3g} ms at batch {best.estimate.batch}"
            )
    return f"{what}: no candidate can run it: " + "; ".join(
        f"{r.gpu.name}: {r.reason}" for r in rows[:4]
    )


__all__ = [
    "BATCH_CAP",
    "SCENARIOS",
    "NoViableDeviceError",
    "Ranked",
    "Recommendation",
    "Request",
    "recommend",
    "scenario_for",
]
