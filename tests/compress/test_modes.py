"""Each mode on small models, against the float model, with error bounds the scales imply."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from quant_models import image_like, mlp, single_conv, small_cnn

from modelpress.compress import quantize
from modelpress.ir import save, to_proto
from modelpress.runtime.ort import session
from modelpress.verify import run_model


def _run(model, feeds, optimize="disabled"):
    return session(model, optimize=optimize).run(None, feeds)[0]


def _initializer(model, name):
    return model.graph.initializers[name].const_value.numpy()


def _conv(x, w, pad=1):
    """Plain NCHW convolution (stride 1) by summing shifted slices."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, o, h, wd))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + h, j : j + wd], w[:, :, i, j])
    return out


def test_static_single_conv_error_within_scale_bound(rng):
    model = single_conv()
    calib = [{"x": rng.standard_normal((4, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    r = quantize(model, mode="static", data=calib, bias_correction=False, optimize=False)
    q = r.model
    sx = float(_initializer(q, "x_scale"))
    sw = _initializer(q, "w_scale")
    w = _initializer(model, "w")
    x = np.clip(rng.standard_normal((2, 4, 6, 6)), -2, 2).astype(
        np.float32
    )  # inside the calibrated range
    yf = _run(model, {"x": x})
    yq = _run(q, {"x": x})
    ex, ew = sx / 2, (sw / 2)[None, :, None, None]
    bound = (
        _conv(np.ones_like(x), np.abs(w)) * ex
        + _conv(np.abs(x) + ex, np.ones_like(w)) * ew
        + sx * ew
    )  # bias rounding
    assert (np.abs(yq - yf) <= bound * 1.0001 + 1e-6).all()
    assert np.abs(yq - yf).max() > 0  # it really is quantized


def test_static_output_is_standard_qdq_and_fuses(tmp_path, cnn_calib, rng):
    model = small_cnn()
    r = quantize(model, mode="static", data=cnn_calib, optimize=False)
    ops = {(n.domain, n.op_type) for n in r.model.graph}
    assert {d for d, _ in ops} == {""}
    assert {"QuantizeLinear", "DequantizeLinear"} <= {o for _, o in ops}
    assert "Relu" not in {o for _, o in ops}  # folded into the output ranges
    path = tmp_path / "q.onnx"
    save(r.model, path)
    onnx.checker.check_model(str(path), full_check=True)
    proto = to_proto(r.model)
    types = {t.name: t.data_type for t in proto.graph.initializer}
    assert (
        types["w1_quantized"] == onnx.TensorProto.INT8
        and types["x_zero_point"] == onnx.TensorProto.UINT8
    )
    # ONNX Runtime turns the Q/DQ groups into integer kernels
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "fused.onnx")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(str(path), so)
    fused = {n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node}
    assert {"QLinearConv", "QLinearAdd"} <= fused
    x = rng.standard_normal((16, 4, 8, 8)).astype(np.float32)
    yf, yq = _run(model, {"x": x}), _run(r.model, {"x": x}, optimize="all")
    assert np.abs(yq - yf).max() / np.abs(yf).max() < 0.05
    assert r.output_error is not None and r.output_error < 0.05
    assert all(
        layer.sqnr_db is not None and layer.sqnr_db > 20 for layer in r.layers if layer.quantized
    )


def test_bias_correction_reduces_output_mean_shift(rng):
    model = single_conv(seed=3)
    calib = [{"x": (rng.standard_normal((8, 4, 6, 6)) + 2.0).astype(np.float32)} for _ in range(4)]
    x = (rng.standard_normal((64, 4, 6, 6)) + 2.0).astype(np.float32)
    yf = _run(model, {"x": x})
    shift = {}
    for bc in (False, True):
        q = quantize(
            model,
            mode="static",
            data=calib,
            per_channel=False,
            bias_correction=bc,
            gptq=False,  # rounded to nearest: GPTQ already removes most of this shift
            optimize=False,
        ).model
        shift[bc] = np.abs((_run(q, {"x": x}) - yf)[:, :, 1:-1, 1:-1].mean(axis=(0, 2, 3))).mean()
    assert shift[True] < shift[False] / 2


def test_dynamic_single_matmul_error_bound_and_ops(rng):
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w = rng.standard_normal((16, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p.ir_version = 9
    model = from_proto(p)
    r = quantize(model, mode="dynamic", optimize=False)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in r.model.graph}
    x = rng.standard_normal((5, 16)).astype(np.float32)
    yq = _run(r.model, {"x": x})
    yf = x @ w
    sx = (max(x.max(), 0) - min(x.min(), 0)) / 255  # computed at run time from the batch
    sw = np.abs(w).max(axis=0) / 127
    bound = (
        np.abs(w).sum(axis=0) * sx / 2 + (np.abs(x) + sx / 2).sum(axis=1, keepdims=True) * sw / 2
    )
    assert (np.abs(yq - yf) <= bound * 1.0001 + 1e-6).all()


def test_dynamic_mlp_close_and_runs_fused(rng):
    model = mlp()
    calib = [{"x": rng.standard_normal((8, 16)).astype(np.float32)} for _ in range(2)]
    r = quantize(model, mode="dynamic", data=calib, optimize=False)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    yf, yq = _run(model, {"x": x}), _run(r.model, {"x": x}, optimize="all")
    assert np.abs(yq - yf).max() / np.abs(yf).max() < 0.03
    assert len([layer for layer in r.layers if layer.quantized]) == 3


def test_weight_only_int8_conv_bound(rng):
    model = single_conv()
    r = quantize(model, mode="weight-only", optimize=False)
    sw = _initializer(r.model, "w_scale")
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    err = np.abs(_run(r.model, {"x": x}) - _run(model, {"x": x}))
    bound = _conv(np.abs(x), np.ones((6, 4, 3, 3))) * (sw / 2)[None, :, None, None]
    assert (err <= bound * 1.0001 + 1e-6).all() and err.max() > 0
    assert {n.op_type for n in r.model.graph} == {"DequantizeLinear", "Conv"}


def test_weight_only_int4_blocks(rng):
    model = mlp()
    r = quantize(model, mode="weight-only", bits=4, block_size=16, optimize=False)
    assert r.model.opset_imports[""] == 21 and any("opset 17 → 21" in n for n in r.notes)
    dqs = [n for n in r.model.graph if n.op_type == "DequantizeLinear"]
    assert dqs and all(n.attributes.get_int("block_size", 0) == 16 for n in dqs)
    w1 = _initializer(model, "w1")
    sw = _initializer(r.model, "w1_scale")  # (16 / 16, 32) blocks along K
    zw = _initializer(r.model, "w1_zero_point")  # asymmetric: one uint4 zero point per block
    assert sw.shape == zw.shape == (1, 32) and str(zw.dtype) == "uint4"
    x = rng.standard_normal((4, 16)).astype(np.float32)
    names = {v.name for v in r.model.graph.outputs}
    assert names == {"y"}
    # first layer alone: x @ Ŵ, with Ŵ = (q - zero_point) · scale as DequantizeLinear defines it
    from modelpress.compress.quantize.sensitivity import runner

    q1 = _initializer(r.model, "w1_quantized").astype(np.float32)
    w1_hat = (q1 - zw.astype(np.float32)) * sw
    m1q = runner(r.model, outputs=["m1"], optimize="disabled")({"x": x})["m1"]
    np.testing.assert_allclose(m1q, x @ w1_hat, rtol=1e-5, atol=1e-5)
    assert 0 < np.abs(w1_hat - w1).max() <= np.abs(w1).max()
    assert r.size_after < r.size_before
    assert np.abs(_initializer(model, "w1") - w1).max() == 0  # the input model is not modified


def test_fp16_keeps_interface_and_sensitive_ops(rng):
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w = rng.standard_normal((8, 8)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="sm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p.ir_version = 9
    model = from_proto(p)
    r = quantize(model, mode="fp16", optimize=False)
    proto = to_proto(r.model)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {t.name: t.data_type for t in proto.graph.initializer}["w"] == TensorProto.FLOAT16
    casts = [n for n in r.model.graph if n.op_type == "Cast"]
    assert len(casts) == 2  # into the fp16 MatMul, and back to float32 for the Softmax
    x = rng.standard_normal((3, 8)).astype(np.float32)
    yf, yq = _run(model, {"x": x}), _run(r.model, {"x": x})
    assert yq.dtype == np.float32
    np.testing.assert_allclose(yq, yf, rtol=0, atol=5e-3)


def test_fp16_converts_constants_ahead_of_time(rng):
    """A Constant node read by fp16 ops, and an initializer read by an fp16 MatMul and a
    float32 LayerNorm (exporters merge equal tensors, such as zero biases), are stored converted
    for the fp16 readers: no Cast of a constant is left to run at every inference."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w = rng.standard_normal((8, 8)).astype(np.float32)
    zeros = np.zeros(8, np.float32)
    g = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["half"], value=numpy_helper.from_array(np.float32(0.5), "half")
            ),
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "zeros"], ["b"], name="bias"),
            helper.make_node("Mul", ["b", "half"], ["h"], name="scale"),
            helper.make_node(
                "LayerNormalization", ["h", "ones", "zeros"], ["y"], axis=-1, name="ln"
            ),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(zeros, "zeros"),
            numpy_helper.from_array(np.ones(8, np.float32), "ones"),
        ],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p.ir_version = 9
    model = from_proto(p)
    r = quantize(model, mode="fp16", optimize=False)
    onnx.checker.check_model(to_proto(r.model), full_check=True)
    nodes = list(r.model.graph)
    assert "Constant" not in {n.op_type for n in nodes}
    cast_inputs = [n.inputs[0] for n in nodes if n.op_type == "Cast"]
    assert sorted(v.name for v in cast_inputs) == ["h", "x"]  # x in, the Mul's output to LN
    ln = next(n for n in nodes if n.op_type == "LayerNormalization")
    assert ln.inputs[2].dtype == ir.DataType.FLOAT  # the float32 reader keeps the float32 zeros
    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(r.model, {"x": x}), _run(model, {"x": x}), atol=2e-2)


def test_fp16_and_bf16_on_cnn(cnn_calib, rng):
    from onnx.reference import ReferenceEvaluator

    model = small_cnn()
    r = quantize(model, mode="fp16", data=cnn_calib, optimize=False)
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    yf, yq = _run(model, {"x": x}), _run(r.model, {"x": x})
    assert np.abs(yq - yf).max() / np.abs(yf).max() < 2e-3
    b = quantize(model, mode="bf16", optimize=False, report_layers=False)
    proto = to_proto(b.model)
    onnx.checker.check_model(proto, full_check=True)
    # Conv accepts bfloat16 only from opset 22: at opset 17 it must stay float32
    assert {n.op_type for n in b.model.graph if n.op_type == "Conv"} == {"Conv"}
    bf16_values = [
        o
        for n in b.model.graph
        for o in n.outputs
        if o.dtype is not None and o.dtype.name == "BFLOAT16"
    ]
    assert bf16_values  # something did convert (Relu, Add, Gemm ...)
    np.testing.assert_allclose(
        ReferenceEvaluator(proto).run(None, {"x": x})[0], yf, rtol=0, atol=0.05 * np.abs(yf).max()
    )


def test_conv_writing_the_graph_output_is_reported(rng):
    """A Conv that writes a graph output is quantized with its own Q/DQ (ONNX Runtime has no int8
    Conv with a float output); the output keeps its name and the layer report measures it."""
    from quant_models import single_conv

    model = single_conv()
    x_name = model.graph.inputs[0].name
    shape = [d if isinstance(d, int) else 4 for d in model.graph.inputs[0].shape]
    calib = [{x_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(2)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert [v.name for v in r.model.graph.outputs] == [v.name for v in model.graph.outputs]
    (layer,) = [lay for lay in r.layers if lay.op_type == "Conv"]
    assert layer.quantized and layer.rel_error is not None and layer.rel_error < 0.05


@pytest.mark.parametrize("opset", [12, 17])
def test_dynamic_embedding_table_on_old_and_new_opsets(rng, opset):
    """Large tables become int8 rows with one scale each, in a form every opset accepts (an
    Unsqueeze with an axes input would be invalid before opset 13)."""
    from quant_models import embedding_model

    model = embedding_model(rng, opset=opset)
    r = quantize(model, mode="dynamic", optimize=False)
    onnx.checker.check_model(to_proto(r.model), full_check=True)
    ids = rng.integers(0, 4096, (3, 8))
    want = run_model(model, {"ids": ids})["y"]
    got = run_model(r.model, {"ids": ids})["y"]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.03


def test_measured_bias_correction_removes_the_shift_quantized_activations_leave(rng):
    """Activation rounding can shift a mean that weight rounding does not explain: a channel that
    sits near one value (after a Relu, behind a channel of wide range) rounds the same way at
    every pixel. The last layer's output mean, measured on the calibration data, is corrected."""
    from onnx import TensorProto, helper
    from quant_models import _model

    # (reductions of at least 16, so both Convs are quantized)
    w1 = np.zeros((2, 16, 1, 1), np.float32)
    w1[0, 0] = 1.0  # channel 0: an input channel, wide range; channel 1: its bias, 0.37
    w2 = np.zeros((1, 2, 3, 3), np.float32)
    w2[0, 1] = 50.0 / 9
    inits = {
        "w1": w1,
        "b1": np.array([0.0, 0.37], np.float32),
        "w2": w2,
        "b2": np.array([0.0], np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 4, 4])],
        inits,
    )
    calib = [{"x": (rng.standard_normal((8, 16, 6, 6)) * 3).astype(np.float32)} for _ in range(4)]
    x = (rng.standard_normal((32, 16, 6, 6)) * 3).astype(np.float32)
    yf = _run(model, {"x": x})
    shift = {}
    for bc in (False, True):
        q = quantize(model, mode="static", data=calib, bias_correction=bc, optimize=False)
        shift[bc] = abs(float((_run(q.model, {"x": x}, optimize="all") - yf).mean()))
    assert shift[False] > 0.05  # the rounding of 0.37 on the shared grid, times 50
    assert shift[True] < shift[False] / 10


def test_measured_bias_correction_is_for_the_last_weighted_layers():
    """Only layers that reach no other weighted op: correcting each layer's measured shift at
    once would count what upstream layers pass on once per layer."""
    from quant_models import small_cnn

    from modelpress.compress.quantize.bias_correction import last_layers

    model = small_cnn()
    assert [n.name for n in last_layers(model, list(model.graph))] == ["fc"]


def test_measured_bias_correction_gives_a_gemm_without_bias_one(rng):
    """The classifier's shift is corrected even when it had no bias: a zero bias is created."""
    from quant_models import small_cnn

    model = small_cnn()
    fc = next(n for n in model.graph if n.name == "fc")
    fc.resize_inputs(2)
    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    x = np.concatenate([c["x"] for c in calib])
    yf = _run(model, {"x": x})
    shift = {}
    for bc in (False, True):
        q = quantize(model, mode="static", data=calib, bias_correction=bc, optimize=False)
        shift[bc] = np.abs((_run(q.model, {"x": x}, optimize="all") - yf).mean(axis=0)).max()
    assert shift[True] < shift[False] / 5


def test_dynamic_mode_says_when_a_model_has_nothing_for_it(cnn_calib):
    # a CNN with a Gemm head: dynamic quantizes the Gemm, nothing to say
    r = quantize(small_cnn(), mode="dynamic", data=cnn_calib, optimize=False)
    assert any(layer.quantized for layer in r.layers)
    assert not any("nothing to quantize" in n for n in r.notes)
    # Convs only: nothing for dynamic mode, and the note points at static
    conv = quantize(single_conv(), mode="dynamic", optimize=False)
    assert not any(layer.quantized for layer in conv.layers)
    (note,) = [n for n in conv.notes if "nothing to quantize" in n]
    assert "static mode" in note


@pytest.mark.parametrize(
    "mode, options, opset",
    [
        ("static", {}, 13),
        ("static", {"per_channel": False}, 11),
        ("dynamic", {}, 13),
        ("weight-only", {"bits": 8}, 13),
        ("weight-only", {"bits": 4}, 21),
    ],
)
def test_an_opset_11_model_is_upgraded_as_far_as_its_int8_form_needs(
    cnn_calib, rng, mode, options, opset
):
    """Per-channel scales need DequantizeLinear's axis (opset 13), 4-bit blocks its block_size
    (21): an opset-11 export is upgraded that far, and said so; per-tensor int8 stays at 11 (its
    bias has one scale too). Every result passes the checker and runs close to the float model."""
    proto = to_proto(small_cnn(seed=2))
    proto.opset_import[0].version = 11
    onnx.checker.check_model(proto, full_check=True)
    r = quantize(proto, mode=mode, data=cnn_calib, **options)
    out = to_proto(r.model)
    onnx.checker.check_model(out, full_check=True)
    assert {o.domain: o.version for o in out.opset_import}[""] == opset
    upgraded = [n for n in r.notes if n.startswith("upgraded opset 11")]
    assert len(upgraded) == (opset != 11), r.notes
    x = rng.standard_normal((6, 4, 8, 8)).astype(np.float32)
    want, got = _run(proto, {"x": x}), _run(out, {"x": x})
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_weight_only_int4_reports_errors_for_a_gemm_model(cnn_calib):
    """4 bits write a Gemm as MatMul + Add first; the error report compares against that model
    (it named a tensor the original lacks, and the whole report was lost)."""
    r = quantize(small_cnn(seed=4), mode="weight-only", bits=4, data=cnn_calib)
    assert not any(n.startswith("no error report") for n in r.notes), r.notes
    assert r.output_error is not None and 0 < r.output_error < 0.5
    fc = [lay for lay in r.layers if lay.quantized and lay.op_type == "MatMul"]
    assert fc and all(lay.sqnr_db is not None and lay.sqnr_db > 10 for lay in fc)
    # GPTQ solves the Conv with 4-bit blocks (conv2: 32 input channels; conv1's 4 stay int8);
    # rounded to nearest, it is counted in a note, unless kept at 8 bits
    assert not any("Conv weight(s) at 4 bits" in n for n in r.notes), r.notes
    plain = quantize(small_cnn(seed=4), mode="weight-only", bits=4, gptq=False)
    assert any(n.startswith("1 Conv weight(s) at 4 bits") for n in plain.notes), plain.notes
    kept = quantize(small_cnn(seed=4), mode="weight-only", bits=4, gptq=False, exclude=["conv2"])
    assert not any("Conv weight(s) at 4 bits" in n for n in kept.notes), kept.notes


def test_dynamic_mode_smooths_attention_graphs_only(cnn_calib):
    """Outlier smoothing is for transformers' activations; a CNN's head lost 2-5 dB to it."""
    from quant_models import transformer_ffn

    cnn = quantize(small_cnn(), mode="dynamic", data=cnn_calib)
    assert not any("smoothing" in n for n in cnn.notes)
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((4, 8, 32)).astype(np.float32)} for _ in range(2)]
    ffn = quantize(transformer_ffn(), mode="dynamic", data=cal)
    assert any("smoothing" in n for n in ffn.notes)


@pytest.mark.parametrize("mode", ["dynamic", "static", "weight-only"])
def test_a_model_with_nothing_to_quantize_keeps_its_opset(mode, rng):
    """Nothing to do (Convs only, for dynamic mode; no weights at all, for the others): the
    opset-11 export stays at 11."""
    from onnx import TensorProto, helper
    from quant_models import _model

    if mode == "dynamic":
        model = single_conv()
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
        model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], {})
    proto = to_proto(model)
    proto.opset_import[0].version = 11
    shape = [d if isinstance(d, int) else 2 for d in model.graph.inputs[0].shape]
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)}]
    r = quantize(proto, mode=mode, data=calib, optimize=False)
    assert {o.domain: o.version for o in to_proto(r.model).opset_import}[""] == 11
    assert not any(n.startswith("upgraded opset") for n in r.notes), r.notes


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_embedding_tables_are_layers_of_the_report(rng, mode):
    """A table stored as int8 rows is a layer like the others: the report measures its output
    (int8 rows: about 40 dB on Gaussian rows), and --exclude keeps it float."""
    from quant_models import embedding_model

    model = embedding_model(rng)
    calib = [{"ids": rng.integers(0, 4096, (4, 8))} for _ in range(2)]
    r = quantize(model, mode=mode, data=calib, optimize=False)
    (embed,) = [lay for lay in r.layers if lay.name == "embed"]
    assert embed.quantized and embed.op_type == "Gather"
    assert 30 < embed.sqnr_db < 60 and embed.rel_error < 0.03
    kept = quantize(model, mode=mode, data=calib, exclude=["embed"], optimize=False)
    (embed,) = [lay for lay in kept.layers if lay.name == "embed"]
    assert not embed.quantized
    gathers = [n for n in kept.model.graph if n.op_type == "Gather"]
    assert [g.inputs[0].dtype for g in gathers] == [ir.DataType.FLOAT]


def _lstm_model(rng, hidden: int = 16, inputs: int = 8):
    """x[T=6, N, 8] → LSTM (16 hidden, forward) → last hidden state → MatMul head [16, 4]."""
    from onnx import TensorProto, helper
    from quant_models import _model

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    inits = {
        "W": w(1, 4 * hidden, inputs),
        "R": w(1, 4 * hidden, hidden),
        "B": (rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32),
        "head": w(hidden, 4),
        "axes": np.array([0], np.int64),
    }
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["h", "axes"], ["h2"], name="squeeze"),
        helper.make_node("MatMul", ["h2", "head"], ["y"], name="head"),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, "N", inputs])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    return _model(nodes, [x_info], [y_info], inits)


def test_weight_only_stores_recurrent_weights_as_int8_rows(rng):
    """An LSTM's W and R become DequantizeLinear of int8 (one scale per gate row, axis 1), at 8
    bits even when 4 are asked for; the model checks, and its output stays within what 8 bits
    of weight error imply."""
    model = _lstm_model(rng)
    calib = [{"x": rng.standard_normal((6, 4, 8)).astype(np.float32)} for _ in range(2)]
    for bits in (8, 4):
        r = quantize(model, mode="weight-only", bits=bits, data=calib, optimize=False)
        onnx.checker.check_model(to_proto(r.model), full_check=True)
        lstm = next(n for n in r.model.graph if n.op_type == "LSTM")
        for v in lstm.inputs[1:3]:
            dq = v.producer()
            assert dq.op_type == "DequantizeLinear" and dq.inputs[0].dtype == ir.DataType.INT8
            assert dq.attributes.get_int("axis") == 1
        (layer,) = [lay for lay in r.layers if lay.name == "lstm"]
        assert layer.quantized and layer.rel_error < 0.02
        x = rng.standard_normal((6, 5, 8)).astype(np.float32)
        want, got = _run(model, {"x": x}), _run(r.model, {"x": x})
        assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_integer_activation_modes_say_recurrent_layers_stay_float(rng):
    model = _lstm_model(rng)
    calib = [{"x": rng.standard_normal((6, 4, 8)).astype(np.float32)} for _ in range(2)]
    r = quantize(model, mode="dynamic", data=calib, optimize=False)
    (note,) = [n for n in r.notes if "LSTM" in n]
    assert note.startswith("1 LSTM layer(s) stay float32 (") and "weight-only mode" in note
    lstm = next(n for n in r.model.graph if n.op_type == "LSTM")
    assert lstm.inputs[1].const_value is not None  # untouched float weights


def _head_error(model, calib, x):
    """Static int8 of ``model``: (the result, relative error of its outputs on ``x``)."""
    r = quantize(model, mode="static", data=calib, optimize=False)
    want = _run(model, {"x": x})
    got = _run(r.model, {"x": x}, optimize="all")
    return r, float(np.linalg.norm(got - want) / np.linalg.norm(want - want.mean(axis=0)))


def test_a_classifier_head_that_8_bit_inputs_would_disturb_stays_float(rng, monkeypatch):
    """A probe-like head (outputs: small differences of large terms) stays float, and so does the
    global pool computing its input: measured on the calibration data, said in a note, and the
    outputs' error against the float model falls by more than half."""
    from quant_models import probe_head_cnn

    from modelpress.compress.quantize import static as static_mode

    model = probe_head_cnn()
    calib = [{"x": rng.standard_normal((16, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    x = rng.standard_normal((64, 4, 8, 8)).astype(np.float32)
    r, err = _head_error(model, calib, x)
    (note,) = [n for n in r.notes if n.startswith("classifier head fc kept in float")]
    moved = float(note.split("outputs by ")[1].split("%")[0])
    assert 2 < moved < 50  # measured on the calibration data, over the 2% tolerance
    fc = next(n for n in r.model.graph if n.name == "fc")
    assert fc.inputs[1].const_value is not None  # float weights, read as they are
    pool = fc.inputs[0].producer().inputs[0].producer()
    assert pool.op_type == "GlobalAveragePool"
    assert pool.inputs[0].producer().op_type == "DequantizeLinear"  # the chain ends before it
    quantized = {lay.name: lay.quantized for lay in r.layers}
    assert not quantized["fc"] and not quantized["pool"] and quantized["add"]
    # its float weights are the model's; its bias takes the output shift measured upstream,
    # which leaves the outputs' mean on the calibration data where the float model has it
    np.testing.assert_array_equal(fc.inputs[1].const_value.numpy(), _initializer(model, "wf"))
    plain = quantize(model, mode="static", data=calib, optimize=False, bias_correction=False)
    fc_plain = next(n for n in plain.model.graph if n.name == "fc")
    np.testing.assert_array_equal(fc_plain.inputs[2].const_value.numpy(), _initializer(model, "bf"))
    xc = np.concatenate([c["x"] for c in calib])
    want = _run(model, {"x": xc}).mean(axis=0)
    shift = {
        name: np.abs(_run(q.model, {"x": xc}, optimize="all").mean(axis=0) - want).max()
        for name, q in (("corrected", r), ("plain", plain))
    }
    assert shift["corrected"] < shift["plain"] / 3, shift
    monkeypatch.setattr(static_mode, "HEAD_TOLERANCE", float("inf"))  # the head in int8, as before
    r8, err8 = _head_error(model, calib, x)
    assert not any(n.startswith("classifier head") for n in r8.notes)
    assert next(n for n in r8.model.graph if n.name == "fc").inputs[0].producer().op_type == (
        "DequantizeLinear"
    )
    assert err < err8 / 2, (err, err8)


def test_a_head_that_would_read_8_bit_inputs_anyway_stays_in_the_chain(rng, monkeypatch):
    """A head whose input comes through a MaxPool of a Conv's output (scale-shared: 8-bit) would
    gain nothing in float, whatever its measured error: it stays int8, and no note says
    otherwise."""
    from onnx import TensorProto, helper
    from quant_models import _conv_w, _model

    from modelpress.compress.quantize import static as static_mode

    inits = {
        "w": _conv_w(rng, 32, 32, 3),
        "wf": (rng.standard_normal((2, 128)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[8, 8], strides=[8, 8], name="mp"),
        helper.make_node("Flatten", ["m"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    model = _model(nodes, [x], [y], inits)
    monkeypatch.setattr(static_mode, "HEAD_TOLERANCE", 0.0)  # every head judged disturbed
    calib = [{"x": image_like(rng, (8, 32, 16, 16))} for _ in range(2)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert not any(n.startswith("classifier head") for n in r.notes), r.notes
    assert {lay.name: lay.quantized for lay in r.layers}["fc"]


def test_a_head_whose_outputs_do_not_vary_is_not_judged(rng):
    """Calibration samples that all give the same outputs (here: one input repeated) cannot tell
    how much 8-bit inputs matter next to the outputs' spread: the head stays in the chain."""
    from quant_models import probe_head_cnn

    one = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    calib = [{"x": np.repeat(one, 16, axis=0)} for _ in range(2)]
    r = quantize(probe_head_cnn(), mode="static", data=calib, optimize=False)
    assert not any(n.startswith("classifier head") for n in r.notes), r.notes


def test_an_ordinary_head_stays_in_the_int8_chain(rng):
    """On inputs that differ from sample to sample as images do (here in contrast), 8-bit pooled
    features move small_cnn's outputs little next to their spread: the head stays in the chain."""
    calib = [{"x": image_like(rng, (16, 4, 8, 8))} for _ in range(4)]
    r = quantize(small_cnn(), mode="static", data=calib, optimize=False)
    assert not any(n.startswith("classifier head") for n in r.notes), r.notes
    fc = next(n for n in r.model.graph if n.name == "fc")
    assert fc.inputs[0].producer().op_type == "DequantizeLinear"
