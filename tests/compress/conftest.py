"""Fixtures of the quantization tests; the model builders are in ``quant_models``."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def cnn_calib():
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
