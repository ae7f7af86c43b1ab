"""Static int8 on attention-like graphs: outlier smoothing, and float outputs where no int8 op reads."""

from __future__ import annotations

import numpy as np
from quant_models import transformer_ffn

from modelpress.compress.quantize import quantize
from modelpress.verify import run_model


def _error(model, q, x):
    """Relative error of the feed-forward branch (the output minus the float residual)."""
    want = run_model(model, {"x": x})["y"] - x
    got = run_model(q, {"x": x})["y"] - x
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_smoothing_cuts_the_error_of_outlier_channels(rng):
    model = transformer_ffn()
    calib = [{"x": rng.standard_normal((4, 8, 32)).astype(np.float32)} for _ in range(4)]
    x = rng.standard_normal((16, 8, 32)).astype(np.float32)
    smoothed = quantize(model, mode="static", data=calib, optimize=False)
    plain = quantize(model, mode="static", data=calib, optimize=False, smooth=False)
    assert any("smoothing" in n for n in smoothed.notes)
    assert not any("smoothing" in n for n in plain.notes)
    e_smooth, e_plain = _error(model, smoothed.model, x), _error(model, plain.model, x)
    assert e_smooth < 0.5 * e_plain, (e_smooth, e_plain)
    assert e_smooth < 0.02


def test_matmul_read_only_by_float_ops_keeps_a_float_output(rng):
    calib = [{"x": rng.standard_normal((4, 8, 32)).astype(np.float32)}]
    q = quantize(transformer_ffn(), mode="static", data=calib, optimize=False).model
    by_out = {v.name: n for n in q.graph for v in n.outputs}
    # fc1 feeds fc2 (quantized) through Relu: its output is requantized (the Relu folded into it)
    fc1 = next(n for n in q.graph if n.name == "fc1")
    assert {u.node.op_type for u in fc1.outputs[0].uses()} == {"Add"}
    # fc2 feeds only the float residual Add: no QuantizeLinear after it
    fc2 = next(n for n in q.graph if n.name == "fc2")
    assert [u.node.op_type for u in fc2.outputs[0].uses()] == ["Add"]
    residual = next(n for n in q.graph if n.name == "residual")
    assert by_out[residual.inputs[0].name] is fc2
    # ... while fc2's input is quantized (Q → DQ → MatMul)
    assert by_out[fc2.inputs[0].name].op_type == "DequantizeLinear"


def test_embedding_table_is_stored_as_int8_rows(rng):
    """Static int8 stores a large embedding table as int8 rows (one scale each), as dynamic does:
    the table is most of a transformer's file."""
    from quant_models import embedding_model

    model = embedding_model(rng, width=32)
    calib = [{"ids": rng.integers(0, 4096, (4, 8))} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    int8_tables = [
        v
        for v in r.model.graph.initializers.values()
        if v.const_value.dtype.name == "INT8" and v.shape[0] == 4096
    ]
    assert len(int8_tables) == 1 and r.size_after < 0.3 * r.size_before
    ids = rng.integers(0, 4096, (3, 8))
    want = run_model(model, {"ids": ids})["y"]
    got = run_model(r.model, {"ids": ids})["y"]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.03
