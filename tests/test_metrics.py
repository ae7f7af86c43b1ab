"""verify.metrics against the formulas written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelpress.verify import metrics


def test_accuracy_and_agreement_count_argmax_hits():
    scores = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    labels = np.array([1, 0, 0, 0])
    assert metrics.top1_hits(scores, labels) == 3
    assert metrics.accuracy(scores, labels) == 0.75
    other = scores[:, ::-1]
    assert metrics.agreement(scores, scores) == 1.0
    assert metrics.agreement(scores, other) == 0.0


def test_cosine_per_sample_with_zero_vectors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3, 4))
    b = rng.standard_normal((5, 3, 4))
    fa, fb = a.reshape(5, -1), b.reshape(5, -1)
    want = [float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(fa, fb)]
    np.testing.assert_allclose(metrics.cosine(a, b), want, rtol=1e-12)
    assert metrics.mean_cosine(a, b) == pytest.approx(np.mean(want), rel=1e-12)
    zero = np.zeros((2, 3))
    assert list(metrics.cosine(zero, zero)) == [1.0, 1.0]
    assert list(metrics.cosine(zero, np.ones((2, 3)))) == [0.0, 0.0]


def test_sqnr_and_relative_error():
    assert metrics.sqnr_db(100.0, 1.0) == pytest.approx(20.0, abs=1e-12)
    assert metrics.relative_error(100.0, 1.0) == pytest.approx(0.1, abs=1e-12)
    assert metrics.sqnr_db(1.0, 0.0) == math.inf
    assert metrics.sqnr_db(0.0, 1.0) == -math.inf
    assert metrics.sqnr_db(1.0, math.inf) == -math.inf
    assert metrics.relative_error(0.0, 0.0) == 0.0
    assert metrics.mse([1.0, 2.0], [1.0, 4.0]) == 2.0
