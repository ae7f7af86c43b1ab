"""Per-node FLOPs and bytes against hand-computed values; the batch-linear workload built from them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mp_testing import model_from_text
from onnx import TensorProto, helper, numpy_helper

from modelpress.ir import from_proto
from modelpress.profile import profile_model, workload_from_onnx


def _single_node(op, inputs, output, weights, **attrs):
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in weights.items()
    ]
    node = helper.make_node(op, [*inputs, *weights], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return from_proto(proto)


CONV = _single_node(
    "Conv", {"x": [1, 3, 8, 8]}, [1, 4, 8, 8], {"w": (4, 3, 3, 3), "b": (4,)}, pads=[1, 1, 1, 1]
)
GEMM = _single_node("Gemm", {"a": [2, 3]}, [2, 4], {"w": (3, 4), "c": (4,)})

# scaled dot-product attention on (batch N, heads 2, sequence 4, head dim 8)
ATTENTION = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 2, 4, 8] q, float[N, 2, 8, 4] kt, float[N, 2, 4, 8] v) => (float[N, 2, 4, 8] o) {
  s = MatMul(q, kt)
  p = Softmax<axis = -1>(s)
  o = MatMul(p, v)
}
"""


def _by_op(cost):
    return {n.op_type: n for n in cost.nodes}


def test_conv_flops_and_bytes():
    n = _by_op(profile_model(CONV))["Conv"]
    # each of 4·8·8 outputs: 3·3·3 multiply-adds (2 FLOPs) plus the bias add
    assert n.flops == 2 * 256 * 27 + 256
    assert n.weight_elems == 4 * 27 + 4
    assert n.weight_bytes == 4 * (4 * 27 + 4)
    assert n.activation_elems == 3 * 64 + 4 * 64
    assert n.intensity == pytest.approx(n.flops / (4 * (112 + 448)), rel=1e-12)


def test_gemm_flops():
    n = _by_op(profile_model(GEMM))["Gemm"]
    assert n.flops == 2 * 2 * 4 * 3 + 2 * 4
    assert n.weight_elems == 12 + 4
    assert n.activation_elems == 6 + 8


def test_attention_flops_at_batch():
    cost = profile_model(
        model_from_text(ATTENTION), {"q": (3, 2, 4, 8), "kt": (3, 2, 8, 4), "v": (3, 2, 4, 8)}
    )
    flops = [n.flops for n in cost.nodes]
    # QKᵀ and PV: 2·(3·2·4·4)·8 each; softmax 5 FLOPs per score
    assert flops == [2 * 96 * 8, 5 * 96, 2 * 3 * 2 * 4 * 8 * 4]
    assert cost.unknown_shapes == 0


def test_workload_from_onnx_is_per_sample():
    w = workload_from_onnx(model_from_text(ATTENTION), name="attn")
    per_sample = [k.flops for k in w.kernels]
    assert per_sample == [2 * 32 * 8, 5 * 32, 2 * 2 * 4 * 8 * 4]
    assert [k.kind for k in w.kernels] == ["matmul", "reduce", "matmul"]
    assert w.params == 0
    first = w.kernels[0]
    assert first.in_elems == 2 * 4 * 8 + 2 * 8 * 4 and first.out_elems == 2 * 4 * 4


def test_workload_from_onnx_fixed_batch_divides():
    w = workload_from_onnx(GEMM, name="gemm")
    (k,) = w.kernels
    assert k.flops == (2 * 2 * 4 * 3 + 2 * 4) / 2
    assert k.weight_elems == 16 and w.params == 16


def test_shapes_from_a_run_when_inference_gives_up(monkeypatch):
    # ONNX shape inference gives up on some exported graphs (it raises, and nothing is inferred);
    # simulate that, and the workload takes the shapes from one ONNX Runtime run instead
    def give_up(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("simulated failure")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", give_up)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
        [w],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert profile_model(model, {"x": (1, 64)}).unknown_shapes > 0
    wl = workload_from_onnx(model, name="run-shapes")
    relu, matmul = wl.kernels
    assert (relu.flops, relu.in_elems, relu.out_elems) == (64, 64, 64)
    assert matmul.flops == 2 * 64 * 32 and matmul.weight_elems == 64 * 32 and matmul.out_elems == 32
    assert wl.notes == ()
