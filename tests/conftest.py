"""Shared fixtures. Helper functions live in ``mp_testing`` (importable by name)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)
