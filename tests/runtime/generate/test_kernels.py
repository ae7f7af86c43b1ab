"""The probe of whether this CPU's int4 kernel computes a row alike alone and in a batch."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.runtime.generate import kernels
from modelpress.runtime.ort import session


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("block_size", [32, 128])
def test_the_probe_answers_what_the_kernel_does(block_size, symmetric):
    # the answer is checked against a run of its own: other rows, three of them, each compared
    # with itself alone; and the kernel is checked to compute the probe's weights (a probe that
    # multiplied nothing could not pass)
    sess = session(kernels.model(block_size, symmetric, 4))
    a = np.random.default_rng(7).standard_normal((3, kernels.K)).astype(np.float32)
    together = sess.run(None, {"a": a})[0]
    alone = np.concatenate([sess.run(None, {"a": a[i : i + 1]})[0] for i in range(3)])
    agree = kernels.int4_rows_agree(block_size, symmetric, threads=1)
    assert agree == bool(np.array_equal(together.view(np.uint32), alone.view(np.uint32)))

    b = kernels.blocks(block_size, symmetric)
    zero = 8.0 if b.zero_points is None else b.zero_points.astype(np.float64)[..., None]
    count = kernels.K // block_size
    codes = b.codes.reshape(kernels.N, count, block_size).astype(np.float64)
    w = ((codes - zero) * b.scales[..., None]).reshape(kernels.N, kernels.K)
    reference = a @ w.T
    # activations are quantized to 8 bits per block (accuracy_level 4): about 1% of the scale
    assert np.abs(together - reference).max() < 0.02 * np.abs(reference).max()
