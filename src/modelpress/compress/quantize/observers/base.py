"""The observer contract and the streaming histogram that the histogram-based observers share.

An observer sees calibration batches one at a time (``observe(x)``) and turns what it saw into
quantization parameters (``qparams()``). Its state has a fixed size (running extrema, a histogram
of a fixed number of bins), so memory does not grow with the number of samples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from modelpress.compress.quantize.qparams import (
    Granularity,
    PerChannel,
    PerTensor,
    QParams,
    qparams_from_range,
)

PER_TENSOR = PerTensor()


class Observer(ABC):
    """Base class: subclasses implement ``observe`` and ``_range`` (the clip range to quantize)."""

    #: registry name
    name = ""
    #: granularities the observer supports
    supports_per_channel = False

    def __init__(
        self,
        *,
        granularity: Granularity = PER_TENSOR,
        dtype: str = "uint8",
        symmetric: bool = False,
    ):
        if isinstance(granularity, PerChannel) and not self.supports_per_channel:
            raise ValueError(f"observer {self.name!r} supports per-tensor granularity only")
        if not isinstance(granularity, (PerTensor, PerChannel)):
            raise ValueError("activation observers support per-tensor and per-channel granularity")
        self.granularity = granularity
        self.dtype = dtype
        self.symmetric = symmetric
        self.count = 0  # elements seen

    @abstractmethod
    def observe(self, x: np.ndarray) -> None:
        """Record the statistics of one batch."""

    @abstractmethod
    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        """The clip range ``(lo, hi)`` to quantize, from what was observed."""

    def qparams(self) -> QParams:
        if self.count == 0:
            raise ValueError(f"observer {self.name!r} has seen no data")
        lo, hi = self._range()
        axis = self.granularity.axis if isinstance(self.granularity, PerChannel) else None
        return qparams_from_range(lo, hi, dtype=self.dtype, symmetric=self.symmetric, axis=axis)

    def _channel_minmax(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.float32)
        if isinstance(self.granularity, PerChannel) and x.ndim:
            axis = self.granularity.axis % x.ndim
            moved = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
            return moved.min(axis=1), moved.max(axis=1)
        return np.asarray(x.min()), np.asarray(x.max())


class StreamingHistogram:
    """A histogram of ``bins`` equal bins over a range that widens as data arrives.

    When a batch falls outside the current range, the range grows to cover it and the old counts are
    moved onto the new bins by interpolating their cumulative distribution: counts are conserved and
    spread uniformly inside each old bin (the usual assumption of histogram calibration).
    """

    def __init__(self, bins: int = 2048, *, from_zero: bool = False):
        self.bins = bins
        self.from_zero = from_zero  # the range always starts at 0 (histograms of magnitudes)
        self.counts = np.zeros(bins, dtype=np.float64)
        self.lo: float | None = None
        self.hi: float | None = None

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, self.bins + 1)

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        if self.from_zero:
            lo = min(lo, 0.0)
        if self.lo is None:
            if hi == lo:  # a constant batch: give the range some width around it
                lo, hi = lo - 0.5 * abs(lo) - 1e-6, hi + 0.5 * abs(hi) + 1e-6
            self.lo, self.hi = lo, hi
        elif lo < self.lo or hi > self.hi:
            self._widen(min(lo, self.lo), max(hi, self.hi))
        c, _ = np.histogram(x, bins=self.bins, range=(self.lo, self.hi))
        self.counts += c

    def _widen(self, lo: float, hi: float) -> None:
        old_edges = self.edges
        cdf = np.concatenate([[0.0], np.cumsum(self.counts)])
        self.lo, self.hi = lo, hi
        new_cdf = np.interp(self.edges, old_edges, cdf, left=0.0, right=cdf[-1])
        self.counts = np.diff(new_cdf)

    def centers(self) -> np.ndarray:
        e = self.edges
        return (e[:-1] + e[1:]) / 2

    def quantile(self, q: float) -> float:
        """The value below which a fraction ``q`` of the data lies (linear inside a bin)."""
        cdf = np.concatenate([[0.0], np.cumsum(self.counts)]) / max(self.total, 1e-30)
        return float(np.interp(q, cdf, self.edges))
