"""Quantize/dequantize round trips at every granularity."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerGroup,
    PerTensor,
    dequantize,
    qparams_from_range,
    quantize,
    weight_qparams,
)


@pytest.mark.parametrize(
    "dtype,symmetric",
    [("uint8", False), ("int8", True), ("int8", False), ("uint8", True), ("int4", True)],
)
def test_round_trip_error_at_most_half_a_step(dtype, symmetric, rng):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    qp = qparams_from_range(x.min(), x.max(), dtype=dtype, symmetric=symmetric)
    err = np.abs(dequantize(quantize(x, qp), qp) - x)
    assert err.max() <= float(qp.scale) / 2 * (1 + 1e-5)


def test_zero_is_exact_and_codes_saturate():
    qp = qparams_from_range(-1.0, 3.0, dtype="uint8")
    assert dequantize(quantize(np.zeros(3, np.float32), qp), qp).tolist() == [0.0, 0.0, 0.0]
    q = quantize(np.array([-100.0, 100.0], np.float32), qp)
    assert q.tolist() == [0, 255]


def test_per_channel_round_trip(rng):
    w = (
        rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
        * np.arange(1, 9, dtype=np.float32)[:, None, None, None]
    )
    qp = weight_qparams(w, PerChannel(0), dtype="int8", symmetric=True)
    assert qp.scale.shape == (8,)
    np.testing.assert_allclose(qp.scale, np.abs(w).reshape(8, -1).max(axis=1) / 127, rtol=1e-6)
    err = np.abs(dequantize(quantize(w, qp), qp) - w)
    assert (err.reshape(8, -1).max(axis=1) <= qp.scale / 2 * (1 + 1e-5)).all()


def test_per_group_round_trip(rng):
    w = rng.standard_normal((64, 6)).astype(np.float32)
    qp = weight_qparams(w, PerGroup(0, 16), dtype="int4", symmetric=True)
    assert qp.scale.shape == (4, 6) and qp.block_size == 16
    np.testing.assert_allclose(qp.scale[1, 2], np.abs(w[16:32, 2]).max() / 7, rtol=1e-6)
    q = quantize(w, qp)
    assert q.min() >= -8 and q.max() <= 7
    err = np.abs(dequantize(q, qp) - w)
    assert (err <= np.repeat(qp.scale, 16, axis=0) / 2 * (1 + 1e-5)).all()


def test_mse_weight_qparams_never_worse_than_minmax(rng):
    w = np.concatenate(
        [rng.standard_normal((8, 200)), rng.standard_normal((8, 1)) * 20], axis=1
    ).astype(np.float32)
    for gran in (PerTensor(), PerChannel(0)):
        a = weight_qparams(w, gran, dtype="int4", method="minmax")
        b = weight_qparams(w, gran, dtype="int4", method="mse")
        ea = np.square(dequantize(quantize(w, a), a) - w).sum()
        eb = np.square(dequantize(quantize(w, b), b) - w).sum()
        assert eb <= ea


def test_round_trip_matches_onnx_quantize_linear(rng):
    """Our arithmetic is ONNX's: compare with QuantizeLinear/DequantizeLinear run by ONNX Runtime."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.runtime.ort import session

    x = (rng.standard_normal((4, 5)) * 3).astype(np.float32)
    qp = qparams_from_range(x.min(), x.max(), dtype="uint8")
    g = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [
            helper.make_tensor_value_info("q", TensorProto.UINT8, [4, 5]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5]),
        ],
        [numpy_helper.from_array(qp.scale, "s"), numpy_helper.from_array(qp.zero_point, "z")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    q, y = session(m.SerializeToString(), optimize="disabled").run(None, {"x": x})
    np.testing.assert_array_equal(q, quantize(x, qp))
    np.testing.assert_allclose(y, dequantize(q, qp), rtol=0, atol=1e-6)
    assert onnx.checker.check_model(m) is None
