"""Percentile observer: clip at the ``percentile`` and ``100 − percentile`` quantiles of a
streaming histogram, discarding the rarest outliers (99.99 by default).

Symmetric quantization clips at the larger magnitude of the two quantiles.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.base import Observer, StreamingHistogram


class PercentileObserver(Observer):
    name = "percentile"

    def __init__(self, *, percentile: float = 99.99, bins: int = 2048, **kwargs):
        super().__init__(**kwargs)
        if not 50 < percentile <= 100:
            raise ValueError("percentile must be in (50, 100]")
        self.percentile = percentile
        self.hist = StreamingHistogram(bins)

    def observe(self, x: np.ndarray) -> None:
        self.hist.add(x)
        self.count += int(np.size(x))

    def _range(self):
        q = self.percentile / 100.0
        return np.asarray(self.hist.quantile(1.0 - q)), np.asarray(self.hist.quantile(q))
