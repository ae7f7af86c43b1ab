"""Observers against hand-computed values and brute-force references."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.compress.quantize.observers import OBSERVERS, StreamingHistogram, get_observer
from modelpress.compress.quantize.observers.entropy import EntropyObserver, kl_divergence
from modelpress.compress.quantize.observers.minmax import MinMaxObserver
from modelpress.compress.quantize.observers.moving_average import MovingAverageMinMaxObserver
from modelpress.compress.quantize.observers.mse import MSEObserver
from modelpress.compress.quantize.observers.percentile import PercentileObserver
from modelpress.compress.quantize.qparams import PerChannel, fake_quantize, qparams_from_range
from modelpress.errors import OptionError


def test_minmax_asymmetric_uint8_by_hand():
    o = MinMaxObserver()
    o.observe(np.array([-1.0, 0.5, 2.0], np.float32))
    o.observe(np.array([3.0, -0.5], np.float32))
    qp = o.qparams()
    # range [-1, 3]: scale 4/255, zero point round(255/4) = 64
    assert qp.scale == pytest.approx(4 / 255)
    assert int(qp.zero_point) == 64
    assert qp.zero_point.dtype == np.uint8


def test_minmax_symmetric_int8_per_channel_by_hand():
    o = MinMaxObserver(granularity=PerChannel(1), dtype="int8", symmetric=True)
    o.observe(np.array([[1.0, -4.0], [-2.0, 0.5]], np.float32))
    qp = o.qparams()
    np.testing.assert_allclose(qp.scale, [2 / 127, 4 / 127], rtol=1e-6)
    assert qp.zero_point.tolist() == [0, 0] and qp.axis == 1


def test_range_always_contains_zero():
    qp = qparams_from_range(2.0, 6.0, dtype="uint8")
    assert int(qp.zero_point) == 0 and qp.scale == pytest.approx(6 / 255)


def test_moving_average_by_hand():
    o = MovingAverageMinMaxObserver(averaging_constant=0.5)
    o.observe(np.array([-2.0, 2.0], np.float32))
    o.observe(np.array([-4.0, 6.0], np.float32))
    # lo: -2 + 0.5 (-4 + 2) = -3; hi: 2 + 0.5 (6 - 2) = 4
    assert o.qparams().scale == pytest.approx(7 / 255)


def test_percentile_clips_rare_outliers():
    x = np.concatenate([np.linspace(-1, 1, 100_000), [50.0]]).astype(np.float32)
    o = PercentileObserver(percentile=99.9)
    o.observe(x)
    lo, hi = (float(v) for v in o.qparams().range)
    # the 0.1% and 99.9% quantiles of uniform [-1, 1] are ±0.998; the histogram bins are 51/2048 wide
    assert lo == pytest.approx(-0.998, abs=0.03) and hi == pytest.approx(0.998, abs=0.03)


def _brute_force_entropy_threshold(x: np.ndarray, bins: int, levels: int) -> float:
    """TensorRT's algorithm written out with plain loops on the raw data's histogram."""
    a = np.abs(x)
    hist, edges = np.histogram(a, bins=bins, range=(0.0, float(a.max())))
    best, best_kl = None, np.inf
    for i in range(levels, bins + 1):
        p = [float(h) for h in hist[:i]]
        p[-1] += float(hist[i:].sum())
        q = [0.0] * i
        width = i // levels
        for j in range(levels):
            start = j * width
            end = i if j == levels - 1 else start + width
            nonzero = [k for k in range(start, end) if hist[k] != 0]
            total = sum(float(hist[k]) for k in range(start, end))
            for k in nonzero:
                q[k] = total / len(nonzero)
        ps, qs = sum(p), sum(q)
        kl = sum(
            (pi / ps) * np.log((pi / ps) / max(qi / qs, 1e-12))
            for pi, qi in zip(p, q, strict=True)
            if pi > 0
        )
        if kl < best_kl:
            best, best_kl = edges[i], kl
    return float(best)


def test_entropy_matches_brute_force():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4000), rng.standard_normal(20) * 8]).astype(np.float32)
    o = EntropyObserver(bins=256, candidates=10_000, dtype="int8", symmetric=True)
    o.observe(x)
    lo, hi = (float(v) for v in o._range())
    t = _brute_force_entropy_threshold(x, bins=256, levels=128)
    assert hi == pytest.approx(min(t, float(x.max())), rel=1e-6)
    assert lo == pytest.approx(max(-t, float(x.min())), rel=1e-6)
    assert t < np.abs(x).max()  # it clipped the outliers


def test_kl_divergence_by_hand():
    p = np.array([1.0, 1.0])
    q = np.array([1.0, 3.0])
    assert kl_divergence(p, q) == pytest.approx(0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75))


def test_mse_close_to_brute_force_on_raw_data():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.laplace(size=20_000), [40.0, -35.0]]).astype(np.float32)
    o = MSEObserver(candidates=100)
    for chunk in np.array_split(x, 7):
        o.observe(chunk)
    qp = o.qparams()
    chosen = float(np.mean((fake_quantize(x, qp) - x) ** 2))
    brute = min(
        float(np.mean((fake_quantize(x, qparams_from_range(x.min() * s, x.max() * s)) - x) ** 2))
        for s in np.linspace(1.0, 0.05, 100)
    )
    full = float(np.mean((fake_quantize(x, qparams_from_range(x.min(), x.max())) - x) ** 2))
    assert chosen <= brute * 1.10
    assert chosen <= full


def test_streaming_histogram_conserves_counts_and_state_is_fixed():
    h = StreamingHistogram(64)
    rng = np.random.default_rng(2)
    for scale in (1, 2, 4, 8, 16):
        h.add(rng.standard_normal(1000) * scale)
    assert h.total == pytest.approx(5000)
    assert h.counts.shape == (64,)
    assert h.lo <= -16 and h.hi >= 16


def test_streamed_entropy_close_to_one_shot():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(50_000).astype(np.float32)
    a = EntropyObserver()
    a.observe(x)
    b = EntropyObserver()
    for chunk in np.array_split(x, 10):
        b.observe(chunk)
    # re-binning as the range widens spreads counts uniformly inside old bins: close, not exact
    assert float(b.qparams().scale) == pytest.approx(float(a.qparams().scale), rel=0.1)


def test_registry_and_errors():
    assert set(OBSERVERS) == {"minmax", "moving-average", "percentile", "entropy", "mse"}
    assert get_observer("kl") is EntropyObserver
    with pytest.raises(OptionError, match="`method` nope"):
        get_observer("nope")
    with pytest.raises(ValueError, match="per-tensor"):
        PercentileObserver(granularity=PerChannel(0))
    with pytest.raises(ValueError, match="no data"):
        MinMaxObserver().qparams()
