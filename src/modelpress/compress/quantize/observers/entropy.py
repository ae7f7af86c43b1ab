"""Entropy observer: the clip threshold that minimises the KL divergence between the histogram of
magnitudes and its quantized version, as TensorRT's entropy calibration does.

For each candidate threshold (a bin edge ``i``), the reference distribution is the first ``i`` bins
with everything beyond folded into the last one; the candidate is those ``i`` bins merged into
``levels`` quantization bins and spread back evenly over the bins that were non-zero. The
threshold of the smallest ``KL(reference || candidate)`` wins. Exact zeros are left out of the
histogram: zero is exact whatever the range. ``levels`` is 128 for signed types
(magnitudes of a symmetric range) and 256 for unsigned data that is never negative.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.base import Observer, StreamingHistogram


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """``KL(p || q)`` of two unnormalised histograms; bins where p is zero contribute nothing."""
    p = p / p.sum()
    q = q / q.sum()
    mask = p > 0
    # q is zero only where p is too (spreading keeps non-zero bins non-zero); guard anyway
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))


def quantized_histogram(hist: np.ndarray, levels: int) -> np.ndarray:
    """``hist`` merged into ``levels`` groups of adjacent bins and spread back over the non-zero
    bins of each group (the last group takes the remainder bins)."""
    n = hist.size
    width = n // levels
    starts = np.arange(levels) * width
    ends = np.append(starts[1:], n)
    out = np.zeros_like(hist)
    for s, e in zip(starts, ends, strict=True):
        chunk = hist[s:e]
        nz = chunk > 0
        k = int(nz.sum())
        if k:
            out[s:e][nz] = chunk.sum() / k
    return out


def best_threshold_index(hist: np.ndarray, levels: int, stride: int = 1) -> int:
    """The number of bins ``i`` (a threshold at edge ``i``) with the smallest KL divergence."""
    best_i, best_kl = hist.size, np.inf
    for i in range(levels, hist.size + 1, stride):
        ref = hist[:i].copy()
        ref[-1] += hist[i:].sum()
        if ref.sum() == 0:
            continue
        cand = quantized_histogram(hist[:i], levels)
        if cand.sum() == 0:
            continue
        kl = kl_divergence(ref, cand)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return best_i


class EntropyObserver(Observer):
    name = "entropy"

    def __init__(self, *, bins: int = 2048, candidates: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.hist = StreamingHistogram(bins, from_zero=True)  # histogram of |x|
        self.candidates = candidates
        self.lo = np.inf
        self.hi = -np.inf

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.size == 0:
            return
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        # Exact zeros (half of a Relu output) are represented exactly by any range: a spike of them
        # in the first bin would make every narrow clip look lossless to the KL test.
        a = np.abs(x)
        self.hist.add(a[a != 0])
        self.count += int(x.size)

    def _range(self):
        unsigned_data = self.lo >= 0 and not self.symmetric
        levels = 256 if unsigned_data else 128
        bins = self.hist.bins
        stride = max(1, (bins - levels) // self.candidates)
        i = best_threshold_index(self.hist.counts, levels, stride)
        t = float(self.hist.edges[i])
        return np.asarray(max(self.lo, -t)), np.asarray(min(self.hi, t))
