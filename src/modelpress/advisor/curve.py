"""The service time of one batch on one replica, as a function of the batch size.

A ``ServiceCurve`` holds service times at a few batch sizes and interpolates linearly between
them (a batch's time is close to affine in its size between neighbouring sizes: a fixed part,
weights and launches, and a per-sample part). Beyond its largest point it extends along its last
segment up to ``limit`` (the largest batch that fits, or was measured).

Where the curve comes from:

- ``estimate_curve``: the advisor's roofline estimate on a catalog device (``estimate.py``);
- ``measure_curve``: ONNX Runtime on this machine (``measured.py``), the way ``bench`` times it;
- ``record_curve``: the latencies a ``modelpress bench --json`` record holds (``measured.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelpress.advisor.catalog import GPU
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import estimate, max_batch
from modelpress.errors import OptionError
from modelpress.profile.workload import Workload

CURVE_LIMIT = 4096  # no service batches more requests than this


@dataclass(frozen=True)
class ServiceCurve:
    batches: tuple[int, ...]  # increasing, starting at 1
    seconds: tuple[float, ...]  # service time of one batch of that size
    limit: int  # the largest batch the replica can take
    source: str  # where the times come from, in words

    def __post_init__(self):
        if not self.batches or self.batches[0] != 1 or len(self.batches) != len(self.seconds):
            raise OptionError("a service curve needs the time of batch 1 and one time per batch")
        if any(b <= a for a, b in zip(self.batches, self.batches[1:], strict=False)):
            raise OptionError("service curve batches must increase")
        if any(s <= 0 for s in self.seconds):
            raise OptionError("service times must be positive")

    def __call__(self, batch) -> np.ndarray:
        """Service seconds for each batch size in ``batch`` (an array or a number)."""
        b = np.asarray(batch, dtype=float)
        xs, ys = np.asarray(self.batches, float), np.asarray(self.seconds, float)
        # a batch never takes less time than a smaller one
        ys = np.maximum.accumulate(ys)
        out = np.interp(b, xs, ys)
        if len(xs) > 1:
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            out = np.where(b > xs[-1], ys[-1] + slope * (b - xs[-1]), out)
        return out

    @property
    def peak_throughput(self) -> float:
        """Requests per second one replica serves at its best sampled batch."""
        return max(b / s for b, s in zip(self.batches, self.seconds, strict=True))

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "limit": self.limit,
            "points": [
                {"batch": b, "ms": round(s * 1e3, 6)}
                for b, s in zip(self.batches, self.seconds, strict=True)
            ],
        }


def sample_batches(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to ``limit``: dense where the curve bends."""
    out, b = [], 1
    while b <= limit:
        out.append(b)
        nxt = b + 1 if b < 4 else (b * 3 // 2 if (b & (b - 1)) == 0 else b * 4 // 3)
        b = max(nxt, b + 1)
    if out[-1] != limit:
        out.append(limit)
    return out


def estimate_curve(
    workload: Workload,
    gpu: GPU,
    *,
    precision: str,
    target_s: float,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    engine: str = "compiled",
) -> ServiceCurve | None:
    """The roofline service curve of ``workload`` on ``gpu``, sampled until a batch's own time
    exceeds ``target_s`` (no such batch can meet the target) or nothing larger fits. None when
    not even one sample fits."""
    top = min(
        CURVE_LIMIT,
        max_batch(workload, gpu, task="infer", precision=precision),
    )
    if top < 1:
        return None
    batches, seconds = [], []
    for b in sample_batches(top):
        est = estimate(
            workload, gpu, task="infer", precision=precision, batch=b, eff=eff, engine=engine
        )
        batches.append(b)
        seconds.append(est.latency_ms / 1e3)
        if seconds[-1] > target_s:
            break
    return ServiceCurve(tuple(batches), tuple(seconds), batches[-1], "roofline estimate")


__all__ = ["CURVE_LIMIT", "ServiceCurve", "estimate_curve", "sample_batches"]
