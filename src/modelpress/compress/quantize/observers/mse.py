"""MSE observer: the clip range that minimises the expected squared quantization error, estimated
on a streaming histogram.

Candidates shrink the observed range ``[lo, hi]`` by factors from 1 down to ``min_shrink``. For each
candidate the error is the clipping error of every bin (measured at its centre) plus the uniform
rounding noise ``scale² / 12`` of every value inside the range; the candidate with the smallest
total wins.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.base import Observer, StreamingHistogram
from modelpress.compress.quantize.qparams import qparams_from_range


class MSEObserver(Observer):
    name = "mse"

    def __init__(
        self, *, bins: int = 2048, candidates: int = 100, min_shrink: float = 0.05, **kwargs
    ):
        super().__init__(**kwargs)
        self.hist = StreamingHistogram(bins)
        self.shrinks = np.linspace(1.0, min_shrink, candidates)

    def observe(self, x: np.ndarray) -> None:
        self.hist.add(x)
        self.count += int(np.size(x))

    def expected_error(self, lo: float, hi: float) -> float:
        qp = qparams_from_range(lo, hi, dtype=self.dtype, symmetric=self.symmetric)
        rlo, rhi = (float(v) for v in qp.range)
        c = self.hist.centers()
        n = self.hist.counts
        clipped = np.clip(c, rlo, rhi)
        inside = n[(c >= rlo) & (c <= rhi)].sum()
        scale = float(qp.scale)
        return float(np.sum(n * (c - clipped) ** 2) + inside * scale * scale / 12.0)

    def _range(self):
        lo, hi = self.hist.lo, self.hist.hi
        errors = [self.expected_error(lo * s, hi * s) for s in self.shrinks]
        s = float(self.shrinks[int(np.argmin(errors))])
        return np.asarray(lo * s), np.asarray(hi * s)
