"""What ONNX Runtime makes of the static QDQ graph: every Q/DQ fused into integer kernels, no float
op and no Q→DQ→op→Q chain left between them (each one would be extra work, making int8 slower)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from quant_models import image_like, small_cnn, thin_stem_cnn

from modelpress.compress import quantize
from modelpress.compress.quantize.heads import head_candidates
from modelpress.ir import save
from modelpress.runtime.ort import session

# Float compute ops that would mean the 8-bit chain was broken (in any domain: NCHWc kernels too).
# MaxPool is not one: it runs on the 8-bit data (no DequantizeLinear before it).
FLOAT_COMPUTE = {"Conv", "Add", "Relu", "Clip", "GlobalAveragePool", "Gemm", "MatMul"}


def _ort_graph(model, tmp_path) -> list[onnx.NodeProto]:
    """The graph ONNX Runtime runs, all optimizations on (QDQ fusion, NHWC layout)."""
    src, opt = tmp_path / "q.onnx", tmp_path / "ort.onnx"
    save(model, src)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(opt)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return list(onnx.load(str(opt)).graph.node)


def _error_vs_float(model, quantized, x: np.ndarray) -> float:
    """Largest deviation of the quantized model (ONNX Runtime, all optimizations) from the float
    one (no optimizations), relative to the float output's largest magnitude."""
    yf = session(model, optimize="disabled").run(None, {"x": x})[0]
    yq = session(quantized, optimize="all").run(None, {"x": x})[0]
    return float(np.abs(yq - yf).max() / np.abs(yf).max())


def _rms_error(model, quantized, x: np.ndarray) -> float:
    """RMS deviation of the quantized model's first output from the float one's, relative to the
    float output's RMS (ONNX Runtime, as in ``_error_vs_float``)."""
    yf = session(model, optimize="disabled").run(None, {"x": x})[0]
    yq = session(quantized, optimize="all").run(None, {"x": x})[0]
    return float(np.sqrt(np.mean((yq - yf) ** 2) / np.mean(yf**2)))


@pytest.fixture
def calib_1ch():
    rng = np.random.default_rng(3)
    return [{"x": image_like(rng, (8, 1, 8, 8))} for _ in range(4)]


def test_residual_cnn_runs_int8_end_to_end(tmp_path, cnn_calib, rng):
    r = quantize(small_cnn(), mode="static", data=cnn_calib, optimize=False)
    nodes = _ort_graph(r.model, tmp_path)
    ops = [n.op_type for n in nodes]
    assert "DequantizeLinear" not in ops  # every DQ fused (QGemm writes the float output itself)
    assert [n.input[0] for n in nodes if n.op_type == "QuantizeLinear"] == ["x"]
    assert not FLOAT_COMPUTE & set(ops), ops
    assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= set(ops)
    # NHWC int8 kernels: one transpose in, one out; none around the residual Add
    assert ops.count("Transpose") <= 2, ops
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(small_cnn(), r.model, x) < 0.05


def test_short_reduction_stem_stays_float_and_chain_after_it_is_int8(tmp_path, calib_1ch, rng):
    model = thin_stem_cnn()
    r = quantize(model, mode="static", data=calib_1ch, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert "stem" not in quantized  # reduction 1·3·3 = 9: the float kernel is faster
    assert {"conv1", "conv2", "fc", "add", "pool"} <= quantized
    nodes = _ort_graph(r.model, tmp_path)
    ops = [n.op_type for n in nodes]
    assert ops.count("Conv") == 1  # the stem, as a float (NCHWc) kernel
    assert ops.count("QuantizeLinear") == 1 and "DequantizeLinear" not in ops
    assert not (FLOAT_COMPUTE - {"Conv"}) & set(ops), ops
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.05


def test_short_reduction_stem_read_by_a_residual_add_is_int8(tmp_path, calib_1ch, rng):
    """The same stem, when the residual Add also reads it: in float it would cost the Add more
    Transposes than its int8 kernel loses, so the whole graph runs in int8."""
    model = thin_stem_cnn(residual=True)
    r = quantize(model, mode="static", data=calib_1ch, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert {"stem", "conv1", "conv2", "fc", "add", "pool"} <= quantized
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert not FLOAT_COMPUTE & set(ops), ops
    assert ops.count("Transpose") <= 2, ops
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.05


@pytest.mark.parametrize(
    ("filters", "pool", "stem_int8"),
    [(16, False, False), (32, False, True), (16, True, True)],
    ids=["thin", "wide", "maxpool-after"],
)
def test_thin_rgb_stem_stays_float(tmp_path, rng, filters, pool, stem_int8):
    """An RGB stem with few filters runs faster as the float kernel (ONNX Runtime's int8 one takes
    its generic path on 3 channels); not with more filters, nor with a MaxPool after it (that
    would then run on 8-bit NCHW data)."""
    from quant_models import rgb_stem_cnn

    model = rgb_stem_cnn(filters=filters, pool=pool)
    calib = [{"x": image_like(rng, (8, 3, 16, 16))} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert ("stem" in quantized) == stem_int8
    assert {"conv1", "fc"} <= quantized
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert ops.count("Conv") == (0 if stem_int8 else 1), ops  # the float stem (NCHWc)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    assert _rms_error(model, r.model, x) < 0.05


def test_shape_of_a_quantized_output_reads_the_8bit_tensor(tmp_path, rng):
    """A dynamo-exported GroupNorm reads its input's Shape. Read from the dequantized tensor, ONNX
    Runtime would give the Shape its own DequantizeLinear of the whole feature map."""
    from quant_models import _conv_w, _model

    inits = {
        "w1": _conv_w(rng, 8, 4, 3),
        "w2": _conv_w(rng, 8, 8, 3),
        "groups": np.array([0, 2, -1], np.int64),
        "gamma": np.ones(2, np.float32),
        "beta": np.zeros(2, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["shp"], name="shape"),
        helper.make_node("Reshape", ["c", "groups"], ["r"], name="to_groups"),
        helper.make_node("InstanceNormalization", ["r", "gamma", "beta"], ["n"], name="norm"),
        helper.make_node("Reshape", ["n", "shp"], ["m"], name="back"),
        helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])
    model = _model(nodes, [x], [y], inits)
    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert {layer.name for layer in r.layers if layer.quantized} == {"conv1", "conv2"}
    shape = next(n for n in r.model.graph if n.op_type == "Shape")
    assert shape.inputs[0].producer().op_type == "QuantizeLinear"
    nodes = _ort_graph(r.model, tmp_path)
    producers = {o: n.op_type for n in nodes for o in n.output}
    (shape,) = [n for n in nodes if n.op_type == "Shape"]
    assert producers[shape.input[0]] == "QLinearConv"
    # two DequantizeLinear: conv1's output for the InstanceNormalization, conv2's into the graph
    # output; none duplicated for the Shape
    dqs = [n.name for n in nodes if n.op_type == "DequantizeLinear"]
    assert len(dqs) == 2 and not any("duplicated" in n for n in dqs), dqs
    xs = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    assert _rms_error(model, r.model, xs) < 0.05


def test_swish_se_resize_slice_stay_in_the_int8_chain(tmp_path, rng):
    from quant_models import swish_se_cnn

    model = swish_se_cnn()
    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert {"sig1", "silu1", "se_act", "se_gate", "excite", "conv2"} <= quantized
    nodes = _ort_graph(r.model, tmp_path)
    ops = [n.op_type for n in nodes]
    assert {"QLinearSigmoid", "QLinearMul", "QLinearLeakyRelu"} <= set(ops), ops
    assert not {"Sigmoid", "Mul", "LeakyRelu"} & set(ops), ops
    # Resize and Slice run on the 8-bit data: nothing dequantizes before them
    producers = {o: n for n in nodes for o in n.output}
    for n in nodes:
        if n.op_type in ("Resize", "Slice") and n.input[0] in producers:
            assert producers[n.input[0]].op_type != "DequantizeLinear", n.name
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08  # six 8-bit steps in a row


def test_unet_skip_relu_shared_by_pool_and_signed_concat(rng, tmp_path):
    """A skip connection: Conv→Relu read by a MaxPool and by a Concat whose other input (a Conv
    without Relu) is signed. The Relu stays folded into its Conv; the Concat must not lend it a
    range below zero (this used to fail an assertion)."""
    from onnx import TensorProto, helper, numpy_helper

    def w(cout, cin):
        return numpy_helper.from_array(
            (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32),
            f"w{cout}_{cin}_{rng.integers(1 << 30)}",
        )

    w1, w2, w3, w4 = w(16, 4), w(16, 16), w(16, 16), w(16, 32)
    nodes = [
        helper.make_node("Conv", ["x", w1.name], ["c1"], name="enc", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="enc_relu"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Conv", ["p1", w2.name], ["c2"], name="mid", pads=[1, 1, 1, 1]),
        helper.make_node(
            "ConvTranspose", ["c2", "wt"], ["u"], name="up", strides=[2, 2], kernel_shape=[2, 2]
        ),
        helper.make_node("Conv", ["u", w3.name], ["c3"], name="dec_in", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["r1", "c3"], ["cat"], name="skip", axis=1),
        helper.make_node("Conv", ["cat", w4.name], ["y"], name="dec", pads=[1, 1, 1, 1]),
    ]
    wt = numpy_helper.from_array(
        (rng.standard_normal((16, 16, 2, 2)) * 0.2).astype(np.float32), "wt"
    )
    graph = helper.make_graph(
        nodes,
        "unet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])],
        [w1, w2, w3, w4, wt],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from modelpress.ir import from_proto

    model = from_proto(proto)
    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    # the last Conv writes the graph output: ONNX Runtime has no int8 Conv with a float output, so
    # it gets its own Q/DQ (else the float kernel would run on weights dequantized at every run)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert {"enc", "mid", "dec_in", "dec"} <= quantized
    assert [v.name for v in r.model.graph.outputs] == ["y"]
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert ops.count("QLinearConv") == 4 and "Conv" not in ops, ops
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.05


@pytest.mark.parametrize(
    ("attrs", "converted"),
    [
        (
            {
                "kernel_shape": [3, 3],
                "strides": [1, 1],
                "pads": [1, 1, 1, 1],
                "count_include_pad": 1,
            },
            True,
        ),
        ({"kernel_shape": [2, 2], "strides": [2, 2]}, True),
        ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),  # border divisors differ
        ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, False),  # partial windows
    ],
)
def test_average_pool_runs_as_int8_depthwise_conv(tmp_path, rng, attrs, converted):
    """ONNX Runtime's QLinearAveragePool is 10x slower than the float pool: an AveragePool inside an
    int8 chain becomes a depthwise Conv with weights 1/(kh·kw) where that is exact."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w1 = (rng.standard_normal((16, 4, 3, 3)) / 6).astype(np.float32)
    w2 = (rng.standard_normal((16, 16, 1, 1)) / 4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c1"], ["p"], name="pool", **attrs),
        helper.make_node("Conv", ["p", "w2"], ["c2"], name="c2"),
        helper.make_node("Relu", ["c2"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    calib = [{"x": rng.standard_normal((8, 4, 9, 9)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib)
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    # (where the rewrite would not be exact, ONNX Runtime still makes its own QLinearAveragePool)
    assert ("QLinearAveragePool" not in ops and ops.count("QLinearConv") == 3) == converted, ops
    x = rng.standard_normal((4, 4, 9, 9)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < (0.05 if converted else 0.1)


def test_excluded_average_pool_stays_a_float_pool(rng):
    """A pool kept in float (``exclude``, or the accuracy budget) stays an AveragePool."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w = (rng.standard_normal((16, 4, 3, 3)) / 6).astype(np.float32)
    nodes = [
        helper.make_node(
            "AveragePool", ["x"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Conv", ["p", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    r = quantize(model, mode="static", data=calib, optimize=False, exclude=["pool"])
    ops = [n.op_type for n in r.model.graph if n.op_type in ("AveragePool", "Conv")]
    assert ops == ["AveragePool", "Conv"]
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.05


def test_initializers_shared_by_several_convs_get_one_dq_each(rng, tmp_path):
    """Exporters merge equal tensors, so two Convs can read one weight and one (zero) bias. Their
    bias scales differ (input scale × weight scale), so each reader needs its own integer copy,
    and the file must stay loadable: unique node and value names (this produced duplicate
    ``*_DQ`` nodes that ONNX Runtime refused)."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    w = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    # an initializer that happens to be named like the shared one's second copy
    b_1 = numpy_helper.from_array(np.full(8, 0.1, np.float32), "b_1")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="first", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Mul", ["r1", "three"], ["m"], name="scale_up"),
        helper.make_node("Conv", ["m", "w", "b"], ["c2"], name="second", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w", "b_1"], ["y"], name="third", pads=[1, 1, 1, 1]),
    ]
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])],
        [w, b, b_1, three],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    calib = [{"x": rng.standard_normal((8, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert {layer.name for layer in r.layers if layer.quantized} >= {"first", "second", "third"}
    names = [n.name for n in r.model.graph]
    assert len(names) == len(set(names))
    values = [o.name for n in r.model.graph for o in n.outputs] + list(r.model.graph.initializers)
    assert len(values) == len(set(values))
    onnx.checker.check_model(onnx.load_from_string(_bytes(r.model)), full_check=True)
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert ops.count("QLinearConv") == 3, ops
    x = rng.standard_normal((4, 8, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08


def _bytes(model) -> bytes:
    from modelpress.ir import model_bytes

    return model_bytes(model)


def test_hardswish_and_hardsigmoid_run_as_int8_add_and_mul(tmp_path, rng):
    """ONNX Runtime has no int8 HardSwish or HardSigmoid. Written as an Add of the input read at
    α times its scale plus β (saturation does the clip) and, for HardSwish, a Mul, they stay in
    the int8 chain: no float activation and no dequantize before them."""
    from quant_models import hardswish_se_cnn

    model = hardswish_se_cnn()
    calib = [{"x": rng.standard_normal((32, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert {"hswish1", "se_gate", "excite", "out_gate", "dwconv", "head"} <= quantized
    nodes = _ort_graph(r.model, tmp_path)
    ops = [n.op_type for n in nodes]
    assert not {"HardSwish", "HardSigmoid", "Mul", "Add", "Conv"} & set(ops), ops
    assert ops.count("QLinearAdd") == 3 and ops.count("QLinearMul") == 2, ops
    # one quantize into the chain, one dequantize out of it (the last Conv writes the output)
    assert [n.output[0] for n in nodes if n.op_type == "DequantizeLinear"] == ["y"], ops
    assert ops.count("QuantizeLinear") == 1, ops
    x = rng.standard_normal((8, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08  # six 8-bit steps in a row
    # each rewritten activation, as the next op reads it, matches the float op
    from modelpress.compress.quantize.sensitivity import runner

    outs = ["a1", "s4", "h"]
    ref = runner(model, outputs=outs, optimize="disabled")({"x": x})
    deq = [f"{o}_dequantized" for o in outs]
    got = runner(r.model, outputs=deq, optimize="disabled")({"x": x})
    for name, q in zip(outs, deq, strict=True):
        assert np.abs(ref[name] - got[q]).max() <= 0.05 * np.abs(ref[name]).max(), name
    assert got["h_dequantized"].min() == 0.0 == ref["h"].min()  # β < 0: the clip at 0 holds


def test_hardsigmoid_with_negative_slope_stays_float():
    import onnx_ir as ir

    from modelpress.compress.quantize.ops import eligible

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 4]))
    ok = ir.node("HardSigmoid", [x], attributes={"alpha": 0.25})
    flipped = ir.node("HardSigmoid", [x], attributes={"alpha": -0.25})
    assert eligible(ok) and not eligible(flipped)


def test_channel_shuffle_after_concat_runs_on_8bit_data(tmp_path, rng):
    """ShuffleNet: a Concat read only through Reshape/Transpose/Slice by quantized Convs is
    quantized at its own output, so the shuffle moves bytes (QLinearConcat, no float Concat, no
    dequantize/quantize around the shuffle)."""
    from quant_models import shuffle_cnn

    model = shuffle_cnn()
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    nodes = _ort_graph(r.model, tmp_path)
    ops = [n.op_type for n in nodes]
    assert "Concat" not in ops and ops.count("QLinearConcat") == 2, ops
    # one quantize into the chain, one dequantize out (before the Relu that writes the output)
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 1, ops
    x = rng.standard_normal((8, 8, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08  # four 8-bit steps in a row


@pytest.mark.parametrize(
    "options", [{"symmetric_activations": True}, {"activation_dtype": "int8"}], ids=str
)
def test_hard_activations_stay_float_where_their_int8_form_does_not_hold(rng, options):
    """Symmetric activations: saturation no longer clips at 0, so HardSigmoid's lower bound would
    be lost. int8 activations: ONNX Runtime (x86) fuses neither the Add nor the Mul. Both keep
    HardSigmoid and HardSwish in float, and the result stays close to the float model."""
    from quant_models import hardswish_se_cnn

    model = hardswish_se_cnn()
    calib = [{"x": rng.standard_normal((32, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False, **options)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert not {"hswish1", "se_gate", "out_gate"} & quantized
    assert {"HardSwish", "HardSigmoid"} <= {n.op_type for n in r.model.graph}
    x = rng.standard_normal((8, 4, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08


def test_concat_read_through_relu_is_not_quantized_at_its_output(rng):
    """Only layout ops make a Concat part of the chain: Concat → Relu → Conv keeps the Relu's
    output as the quantized tensor (quantizing the Concat too would add a Q/DQ pair)."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.compress.quantize.plan import plan
    from modelpress.compress.quantize.selection import observable
    from modelpress.ir import from_proto
    from modelpress.ir.shapes import with_types

    w = lambda cout, cin: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32),
        f"w{cout}_{cin}",
    )
    nodes = [
        helper.make_node("Conv", ["x", "w8_4"], ["c0"], name="a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w8_4"], ["c1"], name="b", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["c0", "c1"], ["cat"], name="cat", axis=1),
        helper.make_node("Relu", ["cat"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w8_16"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])],
        [w(8, 4), w(8, 16)],
    )
    model = with_types(
        from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    )
    p = plan(model)
    assert "cat" not in p.tensors and "r" in p.tensors
    assert "cat" not in observable(model)


def test_squeeze_excite_with_a_short_reduction_stays_in_the_int8_chain(tmp_path, rng):
    """The excite Conv reads 4 channels (reduction 4: the float kernel would win on a feature
    map), but on a 1x1 map its cost is nil and a float one would make the gate, and the Mul over
    the whole feature map, float. It is quantized: ONNX Runtime runs no float op."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    def w(cout, cin, k):
        a = rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)
        return numpy_helper.from_array(a.astype(np.float32), f"w{cout}_{cin}_{k}")

    nodes = [
        helper.make_node("Conv", ["x", "w16_8_3"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
        helper.make_node("Conv", ["p", "w4_16_1"], ["s1"], name="squeeze"),
        helper.make_node("Relu", ["s1"], ["s2"], name="squeeze_relu"),
        helper.make_node("Conv", ["s2", "w16_4_1"], ["s3"], name="excite"),
        helper.make_node("Sigmoid", ["s3"], ["g"], name="gate"),
        helper.make_node("Mul", ["c", "g"], ["e"], name="scale"),
        helper.make_node("Conv", ["e", "w16_16_3"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "se",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])],
        [w(16, 8, 3), w(4, 16, 1), w(16, 4, 1), w(16, 16, 3)],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert {"excite", "gate", "scale"} <= {layer.name for layer in r.layers if layer.quantized}
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert not {"Conv", "Sigmoid", "Mul"} & set(ops), ops
    x = rng.standard_normal((8, 8, 8, 8)).astype(np.float32)
    assert _error_vs_float(model, r.model, x) < 0.08  # as with a float excite path


@pytest.mark.parametrize("relu_before", [False, True])
def test_batchnorm_after_concat_runs_in_int8_on_each_input(tmp_path, rng, relu_before):
    """DenseNet's unfoldable BatchNorm (Mul + Add) after a Concat, with a Relu before it or not:
    distributed over the Concat's inputs as depthwise 1x1 Convs with the Relus folded, so ONNX
    Runtime runs QLinearConvs and a QLinearConcat instead of dequantizing, scaling, shifting and
    quantizing in float, and each input keeps its own scale."""
    from quant_models import dense_cnn

    model = dense_cnn(relu_before=relu_before)
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    quantized = {layer.name for layer in r.layers if layer.quantized}
    assert {"bn_scale_part0", "bn_scale_part1"} <= quantized
    ops = [n.op_type for n in _ort_graph(r.model, tmp_path)]
    assert not {"Mul", "Add", "Relu", "Concat"} & set(ops), ops
    assert ops.count("QLinearConv") == 5 and ops.count("QuantizeLinear") == 1, ops
    assert ops.count("DequantizeLinear") == 1, ops  # the head's output (a graph output)
    assert "QLinearConcat" in ops
    # as accurate as with the affine in float between a dequantize and a quantize
    kept = quantize(model, mode="static", data=calib, optimize=False, exclude=["bn_scale"])
    x = rng.standard_normal((32, 8, 8, 8)).astype(np.float32)
    assert _rms_error(model, r.model, x) < 1.2 * _rms_error(model, kept.model, x)
    assert _rms_error(model, r.model, x) < 0.04


def test_batchnorm_after_concat_with_inputs_read_elsewhere(rng):
    """A Concat input that is also a graph output still feeds its piece; the float Concat, which
    nothing reads any more, is gone."""
    from quant_models import dense_cnn

    model = dense_cnn(shared=True)
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert [n.name for n in r.model.graph if n.op_type == "Concat"] == ["bn_scale_concat"]
    x = rng.standard_normal((8, 8, 8, 8)).astype(np.float32)
    yf = session(model, optimize="disabled").run(None, {"x": x})
    yq = session(r.model, optimize="all").run(None, {"x": x})
    for f, q in zip(yf, yq, strict=True):
        assert np.sqrt(np.mean((q - f) ** 2) / np.mean(f**2)) < 0.04


def test_clip_after_batchnorm_after_concat_keeps_its_max(rng):
    """A ReLU6 (Clip(0, 6)) is not pushed into the pieces as a Relu: it stays after the Concat."""
    from quant_models import dense_cnn

    model = dense_cnn(relu6=True)
    calib = [{"x": 4 * rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    x = 4 * rng.standard_normal((8, 8, 8, 8)).astype(np.float32)
    assert _rms_error(model, r.model, x) < 0.04


def test_excluded_batchnorm_after_concat_turns_back_into_mul_and_add(rng):
    """Excluding the affine by its float name keeps every piece in float, as Mul + Add."""
    from quant_models import dense_cnn

    model = dense_cnn()
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False, exclude=["bn_scale"])
    ops = [n.op_type for n in r.model.graph]
    assert ops.count("Mul") == 2 and ops.count("Add") == 2 and ops.count("Conv") == 3
    assert not {layer.name for layer in r.layers if layer.quantized} & {
        "bn_scale_part0",
        "bn_scale_part1",
    }
    x = rng.standard_normal((8, 8, 8, 8)).astype(np.float32)
    assert _rms_error(model, r.model, x) < 0.04


def test_batchnorm_after_concat_stays_float_with_symmetric_activations(rng):
    """With symmetric activations no Relu folds into a Conv: the pieces would each add a float
    Relu between a dequantize and a quantize, more work than the one float Mul + Add."""
    from quant_models import dense_cnn

    model = dense_cnn()
    calib = [{"x": rng.standard_normal((16, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False, symmetric_activations=True)
    assert not any(layer.name.startswith("bn_scale") for layer in r.layers)
    assert [n.op_type for n in r.model.graph].count("Mul") == 1


def test_affine_that_would_add_a_quantization_point_stays_float():
    """A per-channel affine on float data (the graph input here, a GroupNorm's output in a real
    net) or on an image's few channels stays a Mul + Add: as a Conv it would quantize a tensor
    that was float before."""
    from onnx import TensorProto, helper
    from quant_models import _model, dense_cnn

    from modelpress.compress.quantize.rewrites import affines_as_convs
    from modelpress.ir.shapes import with_types

    assert set(affines_as_convs(with_types(dense_cnn()))[1]) == {"bn_scale_part0", "bn_scale_part1"}
    assert not affines_as_convs(with_types(dense_cnn(channels=8)))[1]
    rng = np.random.default_rng(0)
    inits = {
        "gamma": rng.uniform(0.5, 2.0, (32, 1, 1)).astype(np.float32),
        "beta": np.zeros((32, 1, 1), np.float32),
        "w": (rng.standard_normal((16, 32, 1, 1)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["x", "gamma"], ["s"], name="bn_scale"),
        helper.make_node("Add", ["s", "beta"], ["b"], name="bn_shift"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w"], ["y"], name="conv"),
    ]
    on_input = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])],
        inits,
    )
    assert not affines_as_convs(with_types(on_input))[1]


def _pooled_head_cnn(size: int, classes: int):
    """x[N,32,size,size] → Conv 3x3 (32) → Relu → GlobalAveragePool → Flatten → Gemm(classes)."""
    from quant_models import _conv_w, _model

    rng = np.random.default_rng(0)
    inits = {
        "w": _conv_w(rng, 32, 32, 3),
        "wf": (rng.standard_normal((classes, 32)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])
    return _model(nodes, [x], [y], inits)


@pytest.mark.parametrize(
    ("size", "classes", "candidate"),
    [(16, 10, True), (1, 10, False), (16, 100, False)],
    ids=["small-head", "head-is-much-of-the-work", "head-is-much-of-the-weights"],
)
def test_a_head_may_stay_float_only_when_it_is_a_small_part_of_the_model(size, classes, candidate):
    """At most 1% of the multiply-adds (16x16 maps: 320 of 2.4M; 1x1: 320 of 9.5K) and 5% of the
    weights (10 classes: 320 of 9.5K; 100 classes: 3.2K of 12.4K)."""
    from modelpress.ir.shapes import with_types

    model = with_types(_pooled_head_cnn(size, classes))
    assert head_candidates(model) == (["fc"] if candidate else [])
