"""Fixtures of the quantization tests; the model builders are in ``quant_models``."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def cnn_calib():
    """Inputs of ``small_cnn``'s shape, differing in contrast from sample to sample."""
    from quant_models import image_like

    rng = np.random.default_rng(1)
    return [{"x": image_like(rng, (8, 4, 8, 8))} for _ in range(4)]
