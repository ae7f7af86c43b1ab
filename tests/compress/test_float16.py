"""float16 / bfloat16 conversion (``float16.apply``) on small models built with onnx.helper, each
against ONNX Runtime running the float32 model; every result must pass the full checker."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_models import mlp, small_cnn

from modelpress.compress.quantize import float16
from modelpress.ir import from_proto, to_proto
from modelpress.runtime.ort import session
from modelpress.verify import run_model


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 9
    onnx.checker.check_model(proto, full_check=True)
    return from_proto(proto)


def _convert(model, dtype="fp16"):
    """The converted model, after checking that it is valid."""
    q, _ = float16.apply(model, dtype=dtype)
    onnx.checker.check_model(to_proto(q), full_check=True)
    return q


def _run(model, feeds):
    return session(model, optimize="disabled").run(None, feeds)


def _node(model, op_type):
    return next(n for n in model.graph if n.op_type == op_type)


def _fill_model(op_type, rng):
    """x[N,8] + a float tensor whose type an attribute sets (``op_type``) → MatMul."""
    if op_type == "EyeLike":
        fill = [helper.make_node("EyeLike", ["x"], ["z"], dtype=TensorProto.FLOAT)]
    else:
        half = numpy_helper.from_array(np.array([0.5], np.float32))
        attrs = {"value": half} if op_type == "ConstantOfShape with value" else {}
        fill = [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["z"], **attrs),
        ]
    nodes = fill + [
        helper.make_node("Add", ["x", "z"], ["a"]),
        helper.make_node("MatMul", ["a", "w"], ["y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        {"w": rng.standard_normal((8, 8)).astype(np.float32)},
    )


@pytest.mark.parametrize("op_type", ["ConstantOfShape with value", "ConstantOfShape", "EyeLike"])
def test_attribute_typed_outputs_stay_valid(op_type, rng):
    """ConstantOfShape (the zero initial state of every legacy-exported LSTM/GRU) is lowered with
    its ``value`` converted; EyeLike, whose output type its ``dtype`` sets, stays float32."""
    model = _fill_model(op_type, rng)
    q = _convert(model)
    fill = _node(q, op_type.split()[0])
    expected = ir.DataType.FLOAT if op_type == "EyeLike" else ir.DataType.FLOAT16
    assert fill.outputs[0].dtype == expected
    assert _node(q, "MatMul").outputs[0].dtype == ir.DataType.FLOAT16
    x = rng.standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(q, {"x": x})[0], _run(model, {"x": x})[0], atol=2e-2)


def _buckets_model(rng):
    """T5's log-spaced relative-position buckets: 8 + int(log(rel / 8) / log(16) * 8), then a
    Gather of the bucket's row of an embedding table."""
    nodes = [
        helper.make_node("Cast", ["rel"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["rf", "eight"], ["d"]),
        helper.make_node("Log", ["d"], ["l"]),
        helper.make_node("Div", ["l", "log16"], ["q"]),
        helper.make_node("Mul", ["q", "eight"], ["s"]),
        helper.make_node("Floor", ["s"], ["f"]),
        helper.make_node("Cast", ["f"], ["si"], to=TensorProto.INT64),
        helper.make_node("Add", ["si", "eight_i"], ["bucket"]),
        helper.make_node("Gather", ["table", "bucket"], ["e"], axis=0),
        helper.make_node("MatMul", ["e", "w"], ["y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("rel", TensorProto.INT64, ["N"])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("bucket", TensorProto.INT64, ["N"]),
        ],
        {
            "eight": np.array(8.0, np.float32),
            "log16": np.array(math.log(16.0), np.float32),
            "eight_i": np.array(8, np.int64),
            "table": rng.standard_normal((24, 4)).astype(np.float32),
            "w": rng.standard_normal((4, 4)).astype(np.float32),
        },
    )


def test_float_math_that_computes_indices_stays_float32(rng):
    """In float16, log(16 / 8) / log(16) * 8 rounds below 2 and bucket 10 becomes 9: the float
    ops whose results only become integers stay float32, the rest converts."""
    model = _buckets_model(rng)
    q = _convert(model)
    rel = np.arange(8, 128, dtype=np.int64)
    (y, bucket), (yq, bucket_q) = _run(model, {"rel": rel}), _run(q, {"rel": rel})
    np.testing.assert_array_equal(bucket_q, bucket)
    np.testing.assert_allclose(yq, y, atol=2e-2)
    types = {n.op_type: n.outputs[0].dtype for n in q.graph}
    assert types["Div"] == types["Mul"] == types["Floor"] == ir.DataType.FLOAT
    assert types["Gather"] == types["MatMul"] == ir.DataType.FLOAT16


def test_index_math_does_not_spread_through_the_network(rng):
    """An ordinary MLP or CNN converts entirely, and one whose output is rounded to bytes (an
    image) keeps only the rounding arithmetic float32, not the layers before it."""
    for model in (mlp(), small_cnn()):
        _, kept = float16.apply(model, dtype="fp16")
        assert kept == []
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Relu", ["m1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Mul", ["m2", "scale"], ["s"], name="scale"),
        helper.make_node("Round", ["s"], ["r"], name="round"),
        helper.make_node("Clip", ["r", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Cast", ["c"], ["y"], to=TensorProto.UINT8, name="to_bytes"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["N", 8])],
        {
            "w1": rng.standard_normal((8, 8)).astype(np.float32),
            "w2": rng.standard_normal((8, 8)).astype(np.float32) * 0.1,
            "scale": np.array(255.0, np.float32),
            "lo": np.array(0.0, np.float32),
            "hi": np.array(255.0, np.float32),
        },
    )
    q, kept = float16.apply(model, dtype="fp16")
    onnx.checker.check_model(to_proto(q), full_check=True)
    assert sorted(kept) == ["clip", "round", "scale"]
    x = rng.standard_normal((16, 8)).astype(np.float32)
    diff = _run(q, {"x": x})[0].astype(int) - _run(model, {"x": x})[0].astype(int)
    assert np.abs(diff).max() <= 1


def _masked_attention(rng):
    """Self-attention with the transformers-4.x extended mask, (1 - mask) * finfo(float32).min,
    added to the scores (BERT-family exports)."""
    d = 16
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Div", ["qk", "sqrt_d"], ["scores"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "fmin"], ["ext"]),
        helper.make_node("Unsqueeze", ["ext", "axis1"], ["ext3"]),
        helper.make_node("Add", ["scores", "ext3"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", d]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", d])],
        {
            **{w: rng.standard_normal((d, d)).astype(np.float32) * 0.3 for w in ("wq", "wk", "wv")},
            "sqrt_d": np.array(4.0, np.float32),
            "one": np.array(1.0, np.float32),
            "fmin": np.array(np.finfo(np.float32).min, np.float32),
            "axis1": np.array([1], np.int64),
        },
    )


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_constants_beyond_the_range_are_clamped(dtype, rng):
    """finfo(float32).min would become -inf (in bfloat16 too: float32's largest values round up
    past bfloat16's), and the unmasked positions' 0 * -inf a NaN in every output."""
    from onnx.reference import ReferenceEvaluator

    model = _masked_attention(rng)
    q = _convert(model, dtype)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    mask = np.ones((2, 6), np.int64)
    mask[1, 4:] = 0
    feeds = {"x": x, "attention_mask": mask}
    y = _run(model, feeds)[0]
    if dtype == "fp16":
        yq = _run(q, feeds)[0]
    else:  # ONNX Runtime has no CPU kernels for most bfloat16 ops
        yq = ReferenceEvaluator(to_proto(q)).run(None, feeds)[0]
    assert np.isfinite(yq).all()
    np.testing.assert_allclose(yq, y, atol=0.05 * np.abs(y).max())
    fmin = next(v for v in q.graph.initializers.values() if v.name.startswith("fmin"))
    assert fmin.dtype == float16.TYPES[dtype][0]  # converted, not cast at every run


def _conv_gemm(opset, rng):
    """x[N,4,8,8] → Conv + Relu → GlobalAveragePool → Flatten → Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        {
            "cw": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
            "cb": rng.standard_normal(8).astype(np.float32),
            "fw": rng.standard_normal((3, 8)).astype(np.float32),
            "fb": rng.standard_normal(3).astype(np.float32),
        },
        opset=opset,
    )


def test_schema_note_when_the_opset_blocks_the_conversion(rng):
    """At opset 11 no op accepts bfloat16, so bf16 would return the model unchanged: the note
    says so and names the opset that lets every op convert. Where most ops convert, or for
    float16 (accepted since opset 6), there is nothing to say."""
    model = _conv_gemm(11, rng)
    _, kept = float16.apply(model, dtype="bf16")
    assert len(kept) == 5
    note = float16.schema_note(model, "bf16")
    assert note is not None
    assert "5 of 5" in note and "model opset 11" in note and "Conv needs 22" in note
    assert "--opset 22" in note
    assert float16.schema_note(model, "fp16") is None
    assert float16.schema_note(_conv_gemm(17, rng), "bf16") is None
    assert float16.schema_note(_conv_gemm(22, rng), "bf16") is None


def _nms_model():
    from modelpress.ir import parse

    return parse(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 4] boxes, float[1, 2, 8] logits) => (int64[sel, 3] idx, float[1, 2, 8] s) {
            s = Sigmoid(logits)
            b2 = Mul(boxes, boxes)
            maxo = Constant <value = int64 {3}> ()
            iou = Constant <value = float {0.5}> ()
            thr = Constant <value = float {0.1}> ()
            idx = NonMaxSuppression(b2, s, maxo, iou, thr)
        }"""
    )


def test_inputs_the_spec_types_as_float32_stay_float32():
    """NonMaxSuppression's boxes and scores are ``tensor(float)`` whatever the model's type: the
    ops computing them may go to fp16, NonMaxSuppression reads them cast back."""
    import onnx

    from modelpress.compress import quantize
    from modelpress.ir import to_proto

    model = _nms_model()
    result = quantize(model, mode="fp16")
    onnx.checker.check_model(to_proto(result.model), full_check=True)
    nms = next(n for n in result.model.graph if n.op_type == "NonMaxSuppression")
    assert all(v.dtype in (ir.DataType.FLOAT, ir.DataType.INT64) for v in nms.inputs)
    assert result.check.verified and result.failures == []
    rng = np.random.default_rng(0)
    feeds = {
        "boxes": rng.random((1, 8, 4), dtype=np.float32),
        "logits": rng.standard_normal((1, 2, 8)).astype(np.float32),
    }
    want, got = run_model(model, feeds), run_model(result.model, feeds)
    np.testing.assert_array_equal(got["idx"], want["idx"])


def test_sequences_stay_float32_around_converted_ops():
    """A Sequence built from converted values, read in a Loop: the container ops keep float32,
    so the sequence's declared element type holds; the model loads and matches."""
    from modelpress.compress import quantize
    from modelpress.ir import parse

    w = ", ".join(str(v) for v in np.random.default_rng(0).standard_normal(256).round(3))
    model = parse(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 16] x) => (float[batch, 16] y, float[batch, 16] z) <float[16, 16] W = {{{w}}}> {{
            h = MatMul(x, W)
            y = Relu(h)
            seq = SequenceConstruct(h, y)
            n = SequenceLength(seq)
            keep = Constant <value = bool {{1}}> ()
            z = Loop (n, keep, h) <
                body = b (int64 i, bool c, float[batch, 16] acc) => (bool co, float[batch, 16] ao) {{
                    co = Identity(c)
                    t = SequenceAt(seq, i)
                    ao = Add(acc, t)
                }}
            >
        }}"""
    )
    result = quantize(model, mode="fp16")
    assert result.failures == [] and result.check.deployed_error < 1e-2
    assert any(
        n.op_type == "MatMul" and n.outputs[0].dtype == ir.DataType.FLOAT16
        for n in result.model.graph
    )
