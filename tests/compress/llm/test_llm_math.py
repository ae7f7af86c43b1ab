"""Block grids, GPTQ and AWQ's search on one layer, against formulas and rounding to nearest."""

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from modelpress.compress.llm import awq
from modelpress.compress.llm.calibrate import InputStats
from modelpress.compress.llm.gptq import DAMP, gptq
from modelpress.compress.llm.grid import block_grid, codes_on_grid, dequantize_codes, to_blocks
from modelpress.compress.llm.quantize import quantize_weight
from modelpress.compress.quantize.gptq import output_error
from modelpress.ir import model_bytes, nbits

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
    g = gptq(w, h_fit, form="integer", **opts)
    gptq_plain = output_error(w, dequantize_codes(*g, 4, block_size), h_eval)
    g = gptq(w, h_fit, form="integer", act_order=True, **opts)
    gptq_act = output_error(w, dequantize_codes(*g, 4, block_size), h_eval)
    alpha, s, errors = awq.search([w], h_fit, h_eval, st.mean_abs(), symmetric=False, **opts)
    assert clip < rtn
    assert gptq_plain < 0.7 * rtn and gptq_act < 0.7 * rtn
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
    g, *_ = gptq(w, np.eye(64), bits=4, block_size=32, form="integer", damp=0.0, grid=(scale, zp))
    np.testing.assert_array_equal(g, codes_on_grid(w, scale, zp, 4, 32))


def test_awq_scaled_weights_fold_exactly():
    """diag(s)·W with x/s computes the same product."""
    x = _activations(64, 64)
    w = RNG.standard_normal((64, 8)).astype(np.float32)
    s = awq.scales_for(np.abs(x).mean(0), 0.5)
    np.testing.assert_allclose((x / s) @ (w * s[:, None]), x @ w, rtol=1e-4, atol=1e-4)


def _q4_1_blocks(k=96, n=16, bs=32):
    """``w = d·q + m`` per block of 32 along K (GGUF's Q4_1: fp16 ``d`` and ``m``), every block
    using codes 0 and 15, as llama.cpp's min/max quantizer leaves them."""
    nb = k // bs
    q = RNG.integers(0, 16, size=(nb, bs, n))
    q[:, 0, :], q[:, 1, :] = 0, 15
    d = (RNG.random((nb, 1, n)) * 0.01 + 0.001).astype(np.float16).astype(np.float32)
    m = (-RNG.random((nb, 1, n)) * 0.05).astype(np.float16).astype(np.float32)
    w = (d * q + m).astype(np.float32).reshape(k, n)
    return w, q.reshape(k, n), d[:, 0], m[:, 0]


def test_float_zero_points_reproduce_q4_1_blocks():
    w, q, d, m = _q4_1_blocks()
    scale, zp = block_grid(w, bits=4, block_size=32, symmetric=False, float_zero_point=True)
    codes = codes_on_grid(w, scale, zp, 4, 32)
    np.testing.assert_array_equal(codes, q)
    np.testing.assert_allclose(scale, d, rtol=1e-6)
    np.testing.assert_allclose(-zp * scale, m, rtol=1e-5, atol=1e-8)
    w_hat = dequantize_codes(codes, scale, zp, 4, 32)
    np.testing.assert_allclose(w_hat, w, rtol=0, atol=1e-6 * np.abs(w).max())
    blocks = to_blocks(codes, scale, zp, 4, 32, float_zero_point=True)
    assert blocks.float_zero_points
    np.testing.assert_allclose(blocks.dequantize(), w_hat, rtol=0, atol=1e-7)
    # the integer zero point cannot: its range must hold 0 and its offset is a whole step
    scale, zp = block_grid(w, bits=4, block_size=32, symmetric=False)
    w_int = dequantize_codes(codes_on_grid(w, scale, zp, 4, 32), scale, zp, 4, 32)
    assert np.abs(w_int - w).max() > 100 * np.abs(w_hat - w).max()


def test_float_zero_point_blocks_run_in_onnx_runtime():
    """Grid → MatMulNBits with float zero points (float activations) equals numpy's product."""
    k, n = 100, 24  # a short last block
    w = RNG.standard_normal((k, n)).astype(np.float32)
    x = _activations(512, k)
    h = x.T.astype(np.float64) @ x / len(x)
    codes, scale, zp = gptq(w, h, bits=4, block_size=32, form="float")
    blocks = to_blocks(codes, scale, zp, 4, 32, float_zero_point=True)
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 21, "com.microsoft": 1}, name="g")
    xv = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, k]))
    graph.inputs.append(xv)
    nodes, y = nbits.matmul_nbits(graph, xv, blocks, name="mm", accuracy_level=0)
    graph.extend(nodes)
    y.name = "y"
    graph.outputs.append(y)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        model_bytes(ir.Model(graph, ir_version=10)), so, providers=["CPUExecutionProvider"]
    )
    a = x[:3]
    ref = a.astype(np.float64) @ dequantize_codes(codes, scale, zp, 4, 32)
    np.testing.assert_allclose(sess.run(None, {"x": a})[0], ref, rtol=1e-5, atol=1e-4)


def _block_errors(w, scale, zp, h, bs):
    """``dᵀ H_bb d`` per block and column."""
    d = dequantize_codes(codes_on_grid(w, scale, zp, 4, bs), scale, zp, 4, bs) - w
    out = []
    for b in range(scale.shape[0]):
        r = slice(b * bs, min((b + 1) * bs, len(w)))
        out.append(np.sum((h[r, r] @ d[r]) * d[r], axis=0))
    return np.array(out)


@pytest.mark.parametrize(
    "symmetric,float_zp", [(False, True), (False, False), (True, False)], ids=str
)
@pytest.mark.parametrize("block_size", [32, 128])
def test_searched_grid_never_worse_than_min_max(symmetric, float_zp, block_size):
    x = _activations(1024, 200)  # K=200: a short last block
    h = x.T.astype(np.float64) @ x / len(x)
    w = (RNG.standard_normal((200, 40)) * 0.05).astype(np.float32)
    w[5, :3] = 0.6  # an outlier the plain range pays for
    opts = dict(bits=4, block_size=block_size, symmetric=symmetric, float_zero_point=float_zp)
    plain = _block_errors(w, *block_grid(w, **opts), h, block_size)
    scale, zp = block_grid(w, h=h, **opts)
    searched = _block_errors(w, scale, zp, h, block_size)
    assert np.all(searched <= plain * (1 + 1e-5) + 1e-12)
    assert searched.sum() < 0.8 * plain.sum()
    if not symmetric and not float_zp:  # DequantizeLinear's zero points: integer codes
        assert np.array_equal(zp, np.round(zp)) and zp.min() >= 0 and zp.max() <= 15


def _prepared(h, damp):
    h = np.array(h, np.float64)
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    return h


def _gptq_brute_force(w, h, *, bs, act_order, damp, grid=None):
    """Optimal Brain Quantization one row at a time, each step with the explicit inverse of
    ``H`` over the rows still free (no Cholesky, no lazy updates); a block's min/max float grid
    taken from its rows as they stand when its first row comes (``grid`` fixes them instead)."""
    k, n = w.shape
    h = _prepared(h, damp)
    order = list(np.argsort(-np.diag(h), kind="stable")) if act_order else list(range(k))
    w = np.array(w, np.float64)
    codes = np.zeros((k, n), np.uint8)
    scale, zp = (
        (np.array(grid[0], np.float64), np.array(grid[1], np.float64))
        if grid
        else (
            np.zeros((-(-k // bs), n)),
            np.zeros((-(-k // bs), n)),
        )
    )
    seen = set()
    free = list(order)
    for r in order:
        b = r // bs
        if grid is None and b not in seen:
            rows = w[b * bs : (b + 1) * bs]
            lo, hi = rows.min(0), rows.max(0)
            scale[b] = ((hi - lo) / 15).astype(np.float32)
            zp[b] = (-lo / scale[b]).astype(np.float32)
        seen.add(b)
        q = np.clip(np.round(w[r] / scale[b] + zp[b]), 0, 15)
        codes[r] = q
        e = w[r] - (q - zp[b]) * scale[b]
        hinv = np.linalg.inv(h[np.ix_(free, free)])
        i = free.index(r)
        for j, f in enumerate(free):
            if f != r:
                w[f] -= e * hinv[j, i] / hinv[i, i]
        free.remove(r)
    return codes, scale, zp


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("static", [False, True])
def test_gptq_equals_brute_force_obq(act_order, static):
    """Cholesky path, dampening, act-order and block grids fitted on the way, against the
    step-by-step optimum of the paper's derivation."""
    k, n, bs = 48, 6, 16
    x = _activations(512, k)
    h = x.T.astype(np.float64) @ x / len(x)
    w = (RNG.standard_normal((k, n)) * 0.1).astype(np.float32)
    grid = block_grid(w, bits=4, block_size=bs, symmetric=False, float_zero_point=True)
    ref = _gptq_brute_force(
        w, h, bs=bs, act_order=act_order, damp=DAMP, grid=grid if static else None
    )
    got = gptq(
        w,
        h,
        bits=4,
        block_size=bs,
        form="float",
        act_order=act_order,
        search=False,
        grid=(grid[0].copy(), grid[1].copy()) if static else None,
    )
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[0], ref[0])
    d_got = dequantize_codes(*got, 4, bs) - w
    d_ref = dequantize_codes(ref[0], ref[1].astype(np.float32), ref[2].astype(np.float32), 4, bs)
    e_got, e_ref = output_error(w, d_got + w, h), output_error(w, d_ref, h)
    assert e_got == pytest.approx(e_ref, rel=1e-3)


def test_the_first_position_counts_first_weight_times():
    """The attention sink's row in H (calibrate.collect(sink_weight=...)): weighting the first position of each
    sequence by 5 is the same statistic as that row given 5 times."""
    x = RNG.standard_normal((3, 7, 6))  # 3 sequences of 7 positions
    weighted, repeated = InputStats(), InputStats()
    weighted.add(x, 0, first_weight=5.0)
    rows = np.concatenate([x.reshape(-1, 6), np.repeat(x[:, 0], 4, axis=0)])
    repeated.add(rows, 0)
    np.testing.assert_allclose(weighted.hessian(0), repeated.hessian(0), rtol=1e-12)
    np.testing.assert_allclose(weighted.mean_abs(), repeated.mean_abs(), rtol=1e-12)
    plain = InputStats()
    plain.add(x, 0)
    np.testing.assert_allclose(plain.hessian(0), x.reshape(-1, 6).T @ x.reshape(-1, 6) / 21)
