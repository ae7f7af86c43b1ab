"""Depthwise Convs padded to a multiple of 16 channels (ONNX Runtime's fast int8 kernel): exact,
only where every op around the channels can take the padding, and what static int8 makes of it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from quant_models import _model, mbconv_cnn
from test_static_graph import _ort_graph, _rms_error

from modelpress.compress import quantize
from modelpress.compress.quantize.padding import pad_depthwise
from modelpress.ir import to_proto
from modelpress.runtime.ort import session


def _groups(model) -> dict[str, int]:
    return {
        n.name: n.attributes.get_int("group", 1)
        for n in model.graph
        if n.op_type == "Conv" and n.attributes.get_int("group", 1) > 1
    }


def _run(model, x):
    return session(model, optimize="disabled").run(None, {"x": x})[0]


@pytest.mark.parametrize(
    "kwargs", [{}, {"se": True}, {"se": True, "stride": 2}], ids=["mbconv", "se", "se-stride2"]
)
def test_padded_depthwise_computes_the_same(rng, kwargs):
    model = mbconv_cnn(**kwargs)
    before = to_proto(model).SerializeToString()
    padded, count = pad_depthwise(model)
    assert count == 1
    assert _groups(padded) == {"dw": 80}
    by = {n.name: n for n in padded.graph}
    assert by["expand"].inputs[1].const_value.shape == (80, 24, 1, 1)
    assert by["project"].inputs[1].const_value.shape == (24, 80, 1, 1)
    if kwargs.get("se"):  # squeeze-excite reads and writes the padded channels too
        assert by["se_reduce"].inputs[1].const_value.shape == (8, 80, 1, 1)
        assert by["se_expand"].inputs[1].const_value.shape == (80, 8, 1, 1)
    x = rng.standard_normal((3, 24, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(padded, x), _run(model, x), rtol=1e-5, atol=1e-6)
    assert to_proto(model).SerializeToString() == before  # the input model is not touched


def test_aligned_or_too_small_depthwise_is_left_alone():
    for hidden in (64, 4):  # aligned already; 4 → 16 would make the Convs around it 4x bigger
        _, count = pad_depthwise(mbconv_cnn(hidden=hidden))
        assert count == 0
    padded, count = pad_depthwise(mbconv_cnn(hidden=24))  # 24 → 32: still worth it
    assert count == 1 and _groups(padded) == {"dw": 32}


def _dw_graph(tail: str):
    """x[N,8,8,8] → Conv 1x1 (40) → Relu → depthwise Conv (40) → Relu → ``tail``."""
    rng = np.random.default_rng(0)
    inits = {
        "w1": (rng.standard_normal((40, 8, 1, 1)) * 0.3).astype(np.float32),
        "dw": (rng.standard_normal((40, 1, 3, 3)) / 3).astype(np.float32),
        "w2": (rng.standard_normal((8, 40, 1, 1)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="expand"),
        helper.make_node("Relu", ["a"], ["b"], name="relu1"),
        helper.make_node("Conv", ["b", "dw"], ["c"], name="dw", group=40, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["d"], name="relu2"),
    ]
    outputs = ["y"]
    if tail == "concat":  # the padded channels would land in the middle of the Concat
        nodes.append(helper.make_node("Concat", ["d", "b"], ["y"], name="cat", axis=1))
    elif tail == "output":  # the padded channels would show in a graph output
        nodes.append(helper.make_node("Conv", ["d", "w2"], ["y"], name="project"))
        outputs.append("d")
    elif tail == "reshape":
        inits["shape"] = np.array([0, -1], np.int64)
        nodes.append(helper.make_node("Reshape", ["d", "shape"], ["y"], name="flat"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    rank = 2 if tail == "reshape" else 4
    ys = [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N"] + [None] * (rank - 1))
        for o in outputs
    ]
    return _model(nodes, [x], ys, inits)


@pytest.mark.parametrize("tail", ["concat", "output", "reshape"])
def test_channels_that_reach_other_ops_are_not_padded(tail):
    model = _dw_graph(tail)
    padded, count = pad_depthwise(model)
    assert count == 0
    assert _groups(padded) == {"dw": 40}


def test_conv_that_reads_and_writes_padded_channels(rng):
    """dw(40) → Conv 1x1 40→40 → dw(40): the middle Conv gets zero rows and zero columns."""
    w = rng.standard_normal
    inits = {
        "w1": (w((40, 8, 1, 1)) * 0.3).astype(np.float32),
        "dw1": (w((40, 1, 3, 3)) / 3).astype(np.float32),
        "mid": (w((40, 40, 1, 1)) * 0.2).astype(np.float32),
        "dw2": (w((40, 1, 3, 3)) / 3).astype(np.float32),
        "w2": (w((8, 40, 1, 1)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="expand"),
        helper.make_node("Conv", ["a", "dw1"], ["b"], name="dw1", group=40, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "mid"], ["c"], name="mid"),
        helper.make_node("Relu", ["c"], ["d"], name="relu"),
        helper.make_node("Conv", ["d", "dw2"], ["e"], name="dw2", group=40, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["e", "w2"], ["y"], name="project"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])
    model = _model(nodes, [x], [y], inits)
    padded, count = pad_depthwise(model)
    assert count == 2 and _groups(padded) == {"dw1": 48, "dw2": 48}
    mid = {n.name: n for n in padded.graph}["mid"]
    assert mid.inputs[1].const_value.shape == (48, 48, 1, 1)
    xs = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(padded, xs), _run(model, xs), rtol=1e-5, atol=1e-6)


def test_depthwise_on_the_graph_input_is_not_padded():
    rng = np.random.default_rng(0)
    inits = {"dw": (rng.standard_normal((40, 1, 3, 3)) / 3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "dw"], ["y"], name="dw", group=40, pads=[1, 1, 1, 1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 40, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 40, 8, 8])
    assert pad_depthwise(_model(nodes, [x], [y], inits))[1] == 0


@pytest.mark.parametrize("conv", ["expand", "dw"])
def test_conv_whose_bias_is_not_a_constant_is_not_padded(rng, conv):
    """A bias that is also a graph input (overridable at run time) cannot be padded ahead."""
    inits = {
        "w1": (rng.standard_normal((40, 8, 1, 1)) * 0.3).astype(np.float32),
        "dw": (rng.standard_normal((40, 1, 3, 3)) / 3).astype(np.float32),
        "w2": (rng.standard_normal((8, 40, 1, 1)) * 0.2).astype(np.float32),
        "b": (rng.standard_normal(40) * 0.1).astype(np.float32),
    }
    bias = {"expand": ["b"] if conv == "expand" else [], "dw": ["b"] if conv == "dw" else []}
    nodes = [
        helper.make_node("Conv", ["x", "w1", *bias["expand"]], ["a"], name="expand"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node(
            "Conv", ["r", "dw", *bias["dw"]], ["c"], name="dw", group=40, pads=[1, 1, 1, 1]
        ),
        helper.make_node("Conv", ["c", "w2"], ["y"], name="project"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [40])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])
    model = _model(nodes, [x, b], [y], inits)
    assert pad_depthwise(model)[1] == 0
    calib = [{"x": rng.standard_normal((4, 8, 8, 8)).astype(np.float32)} for _ in range(2)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert not any("padded" in note for note in r.notes)


def test_padded_channels_keep_every_scale(rng, monkeypatch):
    """The copies hold values of a real channel: no tensor's int8 range moves. Zeros would have
    (Sigmoid(0) = 0.5, far above a Mul by ~0.005 of the real channels)."""
    inits = {
        "w1": (rng.standard_normal((40, 8, 1, 1)) * 0.3).astype(np.float32),
        "dw1": (rng.standard_normal((40, 1, 3, 3)) * 0.4).astype(np.float32),
        "k": rng.uniform(0.002, 0.01, (40, 1, 1)).astype(np.float32),
        "dw2": (rng.standard_normal((40, 1, 3, 3)) * 0.4).astype(np.float32),
        "w2": rng.standard_normal((8, 40, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="expand"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "dw1"], ["c"], name="dw1", group=40, pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["s", "k"], ["m"], name="scale"),
        helper.make_node("Conv", ["m", "dw2"], ["e"], name="dw2", group=40, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["e", "w2"], ["y"], name="project"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])
    model = _model(nodes, [x], [y], inits)
    calib = [{"x": rng.standard_normal((8, 8, 8, 8)).astype(np.float32)} for _ in range(4)]

    def scales(m):
        return {
            k: float(v.const_value.numpy())
            for k, v in m.graph.initializers.items()
            if k.endswith("_scale") and v.const_value.numpy().size == 1
        }

    padded = quantize(model, mode="static", data=calib, optimize=False)
    assert any("2 depthwise" in note for note in padded.notes), padded.notes
    from modelpress.compress.quantize import padding

    monkeypatch.setattr(padding, "pad_depthwise", lambda m: (m, 0))
    plain = quantize(model, mode="static", data=calib, optimize=False)
    assert scales(padded.model) == pytest.approx(scales(plain.model), rel=1e-6)
    xs = rng.standard_normal((16, 8, 8, 8)).astype(np.float32)
    assert _rms_error(model, padded.model, xs) == pytest.approx(
        _rms_error(model, plain.model, xs), rel=0.01
    )


def test_conv1d_depthwise_is_not_padded(rng):
    """Only 2-D convolutions: a [C,1,1] constant would broadcast on another axis of a 3-D tensor."""
    inits = {
        "w1": (rng.standard_normal((40, 8, 1)) * 0.3).astype(np.float32),
        "dw": (rng.standard_normal((40, 1, 3)) / 3).astype(np.float32),
        "w2": (rng.standard_normal((8, 40, 1)) * 0.2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="expand"),
        helper.make_node("Conv", ["a", "dw"], ["c"], name="dw", group=40, pads=[1, 1]),
        helper.make_node("Conv", ["c", "w2"], ["y"], name="project"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 16])
    assert pad_depthwise(_model(nodes, [x], [y], inits))[1] == 0


def _qlinear_conv_groups(nodes: list[onnx.NodeProto]) -> list[int]:
    return [
        a.i
        for n in nodes
        if n.op_type == "QLinearConv"
        for a in n.attribute
        if a.name == "group" and a.i > 1
    ]


def test_static_int8_runs_the_padded_depthwise_kernel(tmp_path, rng, monkeypatch):
    model = mbconv_cnn(se=True)
    calib = [{"x": rng.standard_normal((8, 24, 8, 8)).astype(np.float32)} for _ in range(4)]
    r = quantize(model, mode="static", data=calib, optimize=False)
    assert any("padded" in note for note in r.notes), r.notes
    assert {layer.name for layer in r.layers if layer.quantized} >= {"expand", "dw", "project"}
    assert _qlinear_conv_groups(_ort_graph(r.model, tmp_path)) == [80]
    x = rng.standard_normal((16, 24, 8, 8)).astype(np.float32)
    assert _rms_error(model, r.model, x) < 0.05
    # the padded channels (constant values) do not move the scales: as accurate as without
    from modelpress.compress.quantize import padding

    monkeypatch.setattr(padding, "pad_depthwise", lambda m: (m, 0))
    plain = quantize(model, mode="static", data=calib, optimize=False)
    assert _qlinear_conv_groups(_ort_graph(plain.model, tmp_path)) == [72]
    assert _rms_error(model, r.model, x) < 1.2 * _rms_error(model, plain.model, x)
