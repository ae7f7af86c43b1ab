"""Service curves measured on this machine: ONNX Runtime on the CPU, or a ``bench`` record.

``measure_curve`` times the model under ONNX Runtime (all graph optimisations, the runtime's
default threads: one replica is one process using the whole machine) at batch 1, 2, 3, 4, 6, 8,
... with generated inputs, the median of a few runs each, and stops at the first batch whose own
time exceeds the latency target (no larger batch can meet it), at ``limit``, or when its time
budget is spent. Batch sizes go into the graph's batch dimension (dimension 0 of every input);
a graph with a fixed batch is timed at that batch only.

``record_curve`` reads ``modelpress bench --json`` records instead (``bench`` times one batch
per run: one record, or several at different ``--dim batch=N``): each gives a point (batch,
median ms) of the first model in it. With a single point the curve is taken as flat below it
(a smaller batch is no faster) and proportional above it (no better throughput), which can only
overstate the time.
"""

from __future__ import annotations

import csv
import os
import time
from importlib import resources
from pathlib import Path

from modelpress.advisor.calibrate import cpu_name
from modelpress.advisor.curve import CURVE_LIMIT, ServiceCurve, sample_batches
from modelpress.advisor.service import Machine
from modelpress.errors import InputError, OptionError
from modelpress.ir.files import read_json
from modelpress.runtime.measure import time_interleaved
from modelpress.runtime.ort import session
from modelpress.verify.inputs import generate_inputs


def measure_curve(
    model,
    *,
    target_s: float,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    limit: int = 256,
    budget_s: float = 20.0,
    min_runs: int = 3,
) -> ServiceCurve:
    """The service curve of ``model`` (an ``onnx_ir.Model``) under ONNX Runtime on this CPU."""

    batch_dim, fixed = _batch_dim(model)
    sess = session(model, optimize="all")
    start = time.perf_counter()
    batches, seconds = [], []
    sizes = sample_batches(min(limit, CURVE_LIMIT)) if batch_dim else [1]
    for b in sizes:
        feeds = generate_inputs(
            model,
            dims={**(dims or {}), **({batch_dim: b} if batch_dim else {})},
            shapes=_with_batch(shapes, b),
        )
        once = time.perf_counter()
        sess.run(None, feeds)  # warm-up, and the cost of one run
        once = time.perf_counter() - once
        left = budget_s - (time.perf_counter() - start)
        runs = max(min_runs, min(15, int(left / max(once, 1e-6) / 4)))
        timing = time_interleaved([lambda f=feeds: sess.run(None, f)], runs=runs, warmup=1)[0]
        batches.append(b)
        seconds.append(timing.median_ms / 1e3)
        if seconds[-1] > target_s or time.perf_counter() - start > budget_s:
            break
    if fixed and fixed > 1:
        # one run serves up to ``fixed`` requests (the rest of the batch padded): the same time
        return ServiceCurve(
            (1, fixed),
            (seconds[0], seconds[0]),
            fixed,
            f"measured: ONNX Runtime on this machine, fixed batch {fixed}",
        )
    return ServiceCurve(
        tuple(batches),
        tuple(seconds),
        batches[-1],
        f"measured: ONNX Runtime on this machine, batches {batches[0]}-{batches[-1]}",
    )


def _batch_dim(model) -> tuple[str | None, int | None]:
    """The symbolic batch dimension's name (dimension 0 of the first graph input), or the
    graph's fixed batch."""
    initializers = set(model.graph.initializers)
    for value in model.graph.inputs:
        if value.name in initializers or value.shape is None or len(value.shape) == 0:
            continue
        d0 = value.shape[0]
        return (None, d0) if isinstance(d0, int) else (str(d0), None)
    return None, None


def _with_batch(shapes, b):
    if not shapes:
        return None
    return {k: (b, *v[1:]) for k, v in shapes.items()}


def record_curve(paths: list[str | Path]) -> ServiceCurve:
    """A service curve from ``modelpress bench --json`` records (see the module docstring)."""
    points: dict[int, float] = {}
    for path in paths:
        p = Path(path)
        data = read_json(p, what="JSON bench record")
        result = data.get("result", data) if isinstance(data, dict) else None
        try:
            batch = int(result["batch"])
            ms = float(result["models"][0]["timing"]["median_ms"])
        except (TypeError, KeyError, IndexError, ValueError):
            raise InputError(
                f"{p}: not a `modelpress bench --json` record (needs batch and models[0].timing.median_ms)"
            ) from None
        if batch < 1 or ms <= 0:
            raise InputError(f"{p}: batch {batch} and median {ms} ms must be positive")
        points[batch] = ms / 1e3
    if not points:
        raise OptionError("`measured`: give at least one bench record")
    batches = sorted(points)
    seconds = [points[b] for b in batches]
    if batches[0] != 1:
        # below the first point: no faster than it (a smaller batch rarely is much faster)
        batches, seconds = [1, *batches], [seconds[0], *seconds]
    if len(points) == 1:
        # above the one point: proportional (throughput no better than measured)
        batches.append(2 * batches[-1])
        seconds.append(2 * seconds[-1])
    names = ", ".join(Path(p).name for p in paths)
    return ServiceCurve(
        tuple(batches), tuple(seconds), max(batches), f"measured: bench record {names}"
    )


def vcpu_price() -> tuple[float, str]:
    """The default cloud price of one vCPU-hour and its source (``data/cpu_prices.csv``)."""
    text = resources.files("modelpress.advisor").joinpath("data/cpu_prices.csv").read_text()
    row = next(csv.DictReader(text.splitlines()))
    return float(row["usd_per_vcpu_hour"]), row["source"]


def this_machine(
    curve: ServiceCurve, *, cloud_usd_hr: float | None = None, own_usd_hr: float | None = None
):
    """This machine as a service option: its measured curve, rented at the default vCPU price
    × its logical CPUs unless a price is given (owned: only when given)."""
    threads = os.cpu_count() or 1
    source = "rent given by --cpu-usd-hr"
    if cloud_usd_hr is None:
        per_vcpu, where = vcpu_price()
        cloud_usd_hr = per_vcpu * threads
        source = f"rent: {threads} vCPUs x {per_vcpu:g} USD/h ({where})"
    return Machine(
        name=f"this machine ({cpu_name()}, {threads} threads)",
        curve=curve,
        cloud_usd_hr=cloud_usd_hr,
        own_usd_hr=own_usd_hr,
        price_source=source,
    )


__all__ = ["measure_curve", "record_curve", "this_machine", "vcpu_price"]
