"""Block grids, GPTQ and AWQ's search on one layer, against formulas and rounding to nearest."""

import numpy as np
import pytest

from modelpress.compress.llm import awq
from modelpress.compress.llm.calibrate import InputStats
from modelpress.compress.llm.gptq import gptq_codes
from modelpress.compress.llm.grid import (
    block_grid,
    codes_on_grid,
    dequantize_codes,
    output_error,
    to_blocks,
)
from modelpress.compress.llm.quantize import quantize_weight

RNG = np.random.default_rng(0)


def _activations(rows=2048, k=128):
    """Correlated inputs with a few outlier channels, as an LLM's hidden states have."""
    base = RNG.standard_normal((rows, 16)) @ RNG.standard_normal((16, k))
    x = base + 0.3 * RNG.standard_normal((rows, k))
    x[:, :4] *= 20.0
    return x.astype(np.float32)


def _stats(x):
    st = InputStats()
    half = len(x) // 2
    st.add(x[:half], 0)
    st.add(x[half:], 1)
    return st


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_rtn_error_is_at_most_half_a_step(symmetric, bits):
    w = RNG.standard_normal((100, 24)).astype(np.float32)  # K=100: a short last block
    scale, zp = block_grid(w, bits=bits, block_size=32, symmetric=symmetric)
    codes = codes_on_grid(w, scale, zp, bits, 32)
    w_hat = dequantize_codes(codes, scale, zp, bits, 32)
    step = np.repeat(scale, 32, axis=0)[:100]
    assert np.all(np.abs(w - w_hat) <= step / 2 + 1e-6)
    if symmetric:
        # the largest magnitude of each block lands on its sign's extreme code
        s = 2 ** (bits - 1) - 0.5
        np.testing.assert_allclose(scale[0], np.abs(w[:32]).max(axis=0) / s, rtol=1e-6)
    else:
        np.testing.assert_allclose(
            scale[0],
            (np.maximum(w[:32].max(0), 0) - np.minimum(w[:32].min(0), 0)) / (2**bits - 1),
            rtol=1e-6,
        )
    blocks = to_blocks(codes, scale, zp, bits, 32)
    np.testing.assert_allclose(blocks.dequantize(), w_hat, rtol=0, atol=1e-6)


def test_output_error_is_the_trace_formula():
    x = _activations(256, 64)
    w = RNG.standard_normal((64, 8))
    w_hat = w + 0.01 * RNG.standard_normal(w.shape)
    h = x.T.astype(np.float64) @ x / len(x)
    direct = np.sum((x @ w - x @ w_hat) ** 2) / len(x)
    assert output_error(w, w_hat, h) == pytest.approx(direct, rel=1e-6)


@pytest.mark.parametrize("block_size", [32, 128])
def test_clip_gptq_and_awq_beat_rtn_on_held_out_rows(block_size):
    x = _activations(4096, 256)
    w = (RNG.standard_normal((256, 64)) * 0.05).astype(np.float32)
    st = _stats(x)
    h_fit, h_eval = st.hessian(0), st.hessian(1)
    opts = dict(bits=4, block_size=block_size)
    scale, zp = block_grid(w, symmetric=False, **opts)
    rtn = output_error(
        w,
        dequantize_codes(codes_on_grid(w, scale, zp, 4, block_size), scale, zp, 4, block_size),
        h_eval,
    )
    scale, zp = block_grid(w, symmetric=False, h=h_fit, **opts)
    clip = output_error(
        w,
        dequantize_codes(codes_on_grid(w, scale, zp, 4, block_size), scale, zp, 4, block_size),
        h_eval,
    )
    g = gptq_codes(w, h_fit, scale, zp, **opts)
    gptq = output_error(w, dequantize_codes(g, scale, zp, 4, block_size), h_eval)
    g = gptq_codes(w, h_fit, scale, zp, act_order=True, **opts)
    gptq_act = output_error(w, dequantize_codes(g, scale, zp, 4, block_size), h_eval)
    alpha, s, errors = awq.search([w], h_fit, h_eval, st.mean_abs(), symmetric=False, **opts)
    assert clip < rtn
    assert gptq < 0.7 * rtn and gptq_act < 0.7 * rtn
    assert alpha > 0 and errors[alpha] < errors[0.0]  # the outlier channels want scaling
    # the selection keeps the best candidate on the held-out half
    blocks, kept, cand, rel = quantize_weight(
        w, st, None, symmetric=False, candidates=("clip", "gptq", "gptq-act"), **opts
    )
    assert kept == min(cand, key=cand.get) and kept.startswith("gptq")
    assert 0 < rel < 0.05


def test_gptq_equals_rtn_when_inputs_are_uncorrelated_and_equal():
    """With H = I nothing is gained by passing error on: GPTQ rounds to nearest."""
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    scale, zp = block_grid(w, bits=4, block_size=32, symmetric=False)
    g = gptq_codes(w, np.eye(64), scale, zp, bits=4, block_size=32, damp=0.0)
    np.testing.assert_array_equal(g, codes_on_grid(w, scale, zp, 4, 32))


def test_awq_scaled_weights_fold_exactly():
    """diag(s)·W with x/s computes the same product."""
    x = _activations(64, 64)
    w = RNG.standard_normal((64, 8)).astype(np.float32)
    s = awq.scales_for(np.abs(x).mean(0), 0.5)
    np.testing.assert_allclose((x / s) @ (w * s[:, None]), x @ w, rtol=1e-4, atol=1e-4)
