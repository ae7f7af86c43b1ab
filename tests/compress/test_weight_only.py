"""Weight-only 4-bit quantization: asymmetric blocks, GPTQ, and the saved model under ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_models import _model

from modelpress.compress import quantize
from modelpress.compress.quantize import weight_only
from modelpress.compress.quantize.gptq import HessianObserver, gptq
from modelpress.compress.quantize.qparams import QRANGE, dequantize
from modelpress.ir import save, to_proto


def _uneven_inputs(rng, n: int, k: int, *, spread: float = 1.0, mix: float = 0.3) -> np.ndarray:
    """Rows whose channels are correlated (``mix``) and differ in scale (``exp(spread · N(0, 1))``),
    as LayerNorm outputs look to the next MatMul."""
    mix = np.eye(k) + mix * rng.standard_normal((k, k))
    x = rng.standard_normal((n, k)) @ mix
    return (x * np.exp(spread * rng.standard_normal(k))).astype(np.float32)


def _run(proto, feeds, optimize=False):
    """ONNX Runtime on CPU; without optimizations, DequantizeLinear runs as the standard defines."""
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _matmul_model(w: np.ndarray):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[0]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", w.shape[1]])
    return _model(nodes, [x], [y], {"w": w})


def _embed_mlp(rng):
    """ids[N] → Gather(table 20x64) + x[N,64] → MatMul(64x48) → Relu → Gemm(transB, 16x48)."""
    inits = {
        "table": rng.standard_normal((20, 64)).astype(np.float32),
        "w1": (rng.standard_normal((64, 48)) * 0.3).astype(np.float32),
        "w2": (rng.standard_normal((16, 48)) * 0.3).astype(np.float32),
        "b2": (rng.standard_normal(16) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Add", ["e", "x"], ["h"], name="add"),
        helper.make_node("MatMul", ["h", "w1"], ["m"], name="fc1"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1, name="fc2"),
    ]
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    return _model(nodes, inputs, [y], inits), inits


def _dequantized(proto) -> dict[str, np.ndarray]:
    """Each DequantizeLinear's float weight, recomputed in numpy from the stored integers by the
    ONNX definition ``(q - zero_point) * scale`` (block scales repeated along ``axis``)."""
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    out = {}
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        q, s, z = (inits[n].astype(np.float32) for n in node.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
        if block:
            s, z = np.repeat(s, block, axis=axis), np.repeat(z, block, axis=axis)
        elif s.ndim == 1:
            shape = [1] * q.ndim
            shape[axis] = -1
            s, z = s.reshape(shape), z.reshape(shape)
        out[node.output[0]] = (q - z) * s
    return out


def test_asymmetric_int4_round_trip_within_half_a_step(rng):
    # blocks with an offset: an asymmetric range fits them, a symmetric one would waste codes
    w = rng.standard_normal((64, 24)) + rng.standard_normal((4, 1, 24)).repeat(16, 1).reshape(
        64, 24
    )
    w = w.astype(np.float32)
    codes, qp = weight_only.round_to_nearest(w, 1, 0, bits=4, block_size=16)
    assert qp.dtype == "uint4" and qp.scale.shape == (4, 24) and qp.block_size == 16
    assert codes.min() >= 0 and codes.max() <= 15 and len(np.unique(qp.zero_point)) > 1
    lo, hi = (np.repeat(r, 16, axis=0) for r in qp.range)
    w_hat = dequantize(codes, qp)
    inside = (w >= lo) & (w <= hi)
    step = np.repeat(qp.scale, 16, axis=0)
    assert (np.abs(w_hat - w)[inside] <= step[inside] / 2 * (1 + 1e-5)).all()
    # the clip search may clip a few outliers: they land on the edge of the range
    assert np.allclose(w_hat[~inside], np.clip(w, lo, hi)[~inside], atol=1e-6)
    assert inside.mean() > 0.9


def test_saved_model_is_standard_onnx_ort_runs_and_fuses(rng, tmp_path):
    model, inits = _embed_mlp(rng)
    r = quantize(model, mode="weight-only", bits=4, block_size=16, optimize=False)
    path = tmp_path / "q.onnx"
    save(r.model, path)
    proto = to_proto(r.model)
    dq = {n.input[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    types = {t.name: t.data_type for t in proto.graph.initializer}
    # MatMul and Gemm weights: uint4 blocks with uint4 zero points; the table: int8 per row
    blocked = [n for n in dq.values() if any(a.name == "block_size" for a in n.attribute)]
    assert len(blocked) == 2 and len(dq) == 3
    assert all(types[n.input[0]] == types[n.input[2]] == TensorProto.UINT4 for n in blocked)
    assert any("GPTQ: 2 of 2" in note and "generated inputs" in note for note in r.notes)
    # numpy forward pass with the weights the stored integers define
    w = _dequantized(proto)
    ids = rng.integers(0, 20, 8)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    use = {n.name: [w.get(i) for i in n.input] for n in proto.graph.node}
    table, w1, w2 = use["embed"][0], use["fc1"][1], use["fc2"][1]
    ref = np.maximum((table[ids] + x) @ w1, 0) @ w2 + inits["b2"]  # fc2: a Gemm, now [K, N]
    got = _run(onnx.load(str(path)), {"ids": ids, "x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_ort_fuses_the_uint4_blocks_into_matmulnbits(rng, tmp_path):
    w = rng.standard_normal((64, 48)).astype(np.float32)
    r = quantize(_matmul_model(w), mode="weight-only", bits=4, block_size=16, optimize=False)
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(
        to_proto(r.model).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    assert [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node] == ["MatMulNBits"]


def test_gptq_beats_round_to_nearest_on_uneven_inputs(rng):
    k, n = 128, 32
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = _uneven_inputs(rng, 1024, k)
    calib = [{"x": x[i : i + 256]} for i in range(0, 1024, 256)]
    r = quantize(
        _matmul_model(w),
        mode="weight-only",
        bits=4,
        block_size=32,
        data=calib,
        optimize=False,
    )
    (w_gptq,) = _dequantized(to_proto(r.model)).values()
    w_rtn = dequantize(*weight_only.round_to_nearest(w, 1, 0, bits=4, block_size=32))

    def err(w_hat):
        return np.linalg.norm(x @ w - x @ w_hat) / np.linalg.norm(x @ w)

    assert err(w_gptq) < 0.9 * err(w_rtn)
    # ... and ONNX Runtime computes exactly that weight
    got = _run(to_proto(r.model), {"x": x[:64]})
    np.testing.assert_allclose(got, x[:64] @ w_gptq, rtol=1e-4, atol=1e-4 * np.abs(got).max())


def test_layer_keeps_rounding_to_nearest_where_gptq_loses(rng):
    # channel scales over ~4 orders of magnitude: GPTQ's compensation widens the block ranges
    k, n = 64, 8
    x = _uneven_inputs(rng, 600, k, spread=1.5, mix=0.5)
    w = rng.standard_normal((k, n)).astype(np.float32)
    obs = HessianObserver()
    obs.observe(x)
    h = obs.hessian()
    d_rtn = dequantize(*weight_only.round_to_nearest(w, 1, 0, bits=4, block_size=16)) - w
    d_gptq = dequantize(*gptq(w, h, block_size=16)) - w
    assert np.trace(d_gptq.T @ h @ d_gptq) > np.trace(d_rtn.T @ h @ d_rtn)  # the case at hand
    r = quantize(
        _matmul_model(w),
        mode="weight-only",
        bits=4,
        block_size=16,
        data=[{"x": x}],
        optimize=False,
    )
    (w_hat,) = _dequantized(to_proto(r.model)).values()
    np.testing.assert_array_equal(w_hat, d_rtn + w)
    assert any("GPTQ: 0 of 1" in note for note in r.notes)


def test_hessian_streams_and_gptq_codes_stay_in_range(rng):
    x = _uneven_inputs(rng, 600, 64)
    obs = HessianObserver()
    for i in range(0, 600, 100):
        obs.observe(x[i : i + 100].reshape(10, 10, 64))  # any leading shape: rows of the last axis
    np.testing.assert_allclose(obs.hessian(), x.T.astype(np.float64) @ x / 600, rtol=1e-10)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    codes, qp = gptq(w, obs.hessian(), block_size=16)
    qmin, qmax = QRANGE["uint4"]
    assert codes.shape == w.shape and codes.min() >= qmin and codes.max() <= qmax
    assert qp.scale.shape == (4, 8) and qp.axis == 0 and qp.block_size == 16
    delta = dequantize(codes, qp) - w
    d_rtn = dequantize(*weight_only.round_to_nearest(w, 1, 0, bits=4, block_size=16)) - w
    h = obs.hessian()
    assert np.trace(delta.T @ h @ delta) < np.trace(d_rtn.T @ h @ d_rtn)


def test_size_drops_to_the_packed_bytes(rng):
    k, n, b = 256, 256, 32
    w = rng.standard_normal((k, n)).astype(np.float32)
    r = quantize(_matmul_model(w), mode="weight-only", bits=4, block_size=b, optimize=False)
    packed = k * n // 2 + (k // b) * n * 4 + (k // b) * n // 2  # codes, scales, zero points
    assert packed < r.size_after < packed + 2048  # + the graph's own bytes
    assert r.size_after < 0.2 * r.size_before


def test_reduction_axis_not_a_multiple_of_the_block_falls_back_to_int8(rng):
    w = rng.standard_normal((24, 8)).astype(np.float32)
    x = rng.standard_normal((16, 24)).astype(np.float32)
    r = quantize(
        _matmul_model(w),
        mode="weight-only",
        bits=4,
        block_size=16,
        data=[{"x": x}],
        optimize=False,
    )
    proto = to_proto(r.model)
    (node,) = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    assert not any(a.name == "block_size" for a in node.attribute)
    types = {t.name: t.data_type for t in proto.graph.initializer}
    assert types[node.input[0]] == TensorProto.INT8
    assert any("kept int8 per-channel" in note for note in r.notes)
    (w_hat,) = _dequantized(proto).values()
    scale = numpy_helper.to_array(
        next(t for t in proto.graph.initializer if t.name == node.input[1])
    )
    assert (np.abs(w_hat - w) <= scale / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("tables_bits", [None, 4])
def test_tables_stay_8_bit_unless_asked(rng, tables_bits):
    model, _ = _embed_mlp(rng)
    q, done, _ = weight_only.apply(model, bits=4, block_size=16, tables_bits=tables_bits)
    (table_dq,) = [
        n
        for n in q.graph
        if n.op_type == "DequantizeLinear"
        and any(u.node.op_type == "Gather" for u in n.outputs[0].uses())
    ]
    assert "embed" in done
    want = "UINT4" if tables_bits == 4 else "INT8"
    assert table_dq.inputs[0].dtype.name == want


def test_torch_style_gemm_becomes_a_fused_4bit_matmul(rng, tmp_path):
    """A Gemm with transB=1 (how torch exports nn.Linear) is rewritten as MatMul(x, W[K, N]) + Add:
    ONNX Runtime fuses only that form into MatMulNBits."""
    w1 = rng.standard_normal((48, 64)).astype(np.float32)  # [N, K]
    b1 = rng.standard_normal(48).astype(np.float32)
    w2 = rng.standard_normal((32, 48)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Tanh", ["h"], ["t"], name="act"),
        helper.make_node("Gemm", ["t", "w2"], ["y"], name="fc2", transB=1),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])
    model = _model(nodes, [x_info], [y_info], {"w1": w1, "b1": b1, "w2": w2})
    r = quantize(model, mode="weight-only", bits=4, block_size=16, optimize=False)
    assert [n.op_type for n in r.model.graph if n.op_type in ("Gemm", "MatMul")] == ["MatMul"] * 2
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(
        to_proto(r.model).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert ops.count("MatMulNBits") == 2, ops
    x = rng.standard_normal((8, 64)).astype(np.float32)
    exact = _run(to_proto(r.model), {"x": x})  # DequantizeLinear as the standard defines it
    got = sess.run(None, {"x": x})[0]  # the fused kernel
    assert np.abs(got - exact).max() / np.abs(exact).max() < 0.05
    w = _dequantized(to_proto(r.model))
    use = {n.name: [w.get(i) for i in n.input] for n in to_proto(r.model).graph.node}
    ref = np.tanh(x @ use["fc1"][1] + b1) @ use["fc2"][1]  # the dequantized weights, in float
    np.testing.assert_allclose(exact, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
