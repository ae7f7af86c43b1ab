"""ort-fusions (level 3): ONNX Runtime's offline optimizations, persisted and marked as ORT-only."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelpress.ir import from_proto
from modelpress.passes import optimize
from modelpress.passes.optimize import RUNTIME_METADATA_KEY
from modelpress.passes.ort_fusions import METADATA_KEY, OrtFusions, ort_optimize
from modelpress.verify import verify


def conv_matmul_model() -> onnx.ModelProto:
    """Conv → BatchNorm → Relu → Conv → GlobalAveragePool → Flatten → MatMul + Add, batch dynamic."""
    rng = np.random.default_rng(0)

    def init(name, *shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32) * 0.3
        return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)

    inits = [
        init("w1", 16, 3, 3, 3),
        init("b1", 16),
        init("gamma", 16),
        init("beta", 16),
        init("mean", 16),
        init("var", 16, positive=True),
        init("w2", 16, 16, 3, 3),
        init("b2", 16),
        init("wf", 16, 10),
        init("bf", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "wf"], ["m"]),
        helper.make_node("Add", ["m", "bf"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_level3_verifies_against_the_original_and_is_marked():
    proto = conv_matmul_model()
    result = optimize(from_proto(proto), level=3)
    model = result.model
    stats = {p.name: p.rewrites for p in result.passes}
    assert stats["ort-fusions"] > 0
    assert model.metadata_props[RUNTIME_METADATA_KEY] == "onnxruntime"
    assert "onnxruntime" in model.metadata_props[METADATA_KEY]
    assert any(n.domain.startswith("com.microsoft") for n in model.graph)
    assert [v.name for v in model.graph.outputs] == ["logits"]
    assert str(model.graph.inputs[0].shape[0]) == "N"
    # ORT's optimizations disabled in both: the persisted fusions alone must reproduce the results.
    assert verify(proto, model, dims={"N": 3}, runs=3, rtol=1e-5, atol=1e-6).passed


def test_level2_does_not_run_it():
    result = optimize(from_proto(conv_matmul_model()), level=2)
    assert "ort-fusions" not in {p.name for p in result.passes}
    assert RUNTIME_METADATA_KEY not in result.model.metadata_props
    assert all(n.domain == "" for n in result.model.graph)


def test_second_run_without_changes_does_nothing():
    model = from_proto(conv_matmul_model())
    p = OrtFusions()
    assert p(model).modified
    graph = model.graph
    again = p(model)
    assert not again.modified
    assert model.graph is graph


def test_nothing_to_fuse_leaves_the_model_alone():
    proto = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[N, 4] x, float[N, 4] y) => (float[N, 4] z) { z = Add(x, y) }
        """
    )
    model = from_proto(proto)
    graph = model.graph
    p = OrtFusions()
    assert not p(model).modified
    assert p.rewrites == 0 and model.graph is graph
    assert METADATA_KEY not in model.metadata_props


def test_external_data_round_trip_through_ort():
    proto = conv_matmul_model()
    optimized = ort_optimize(from_proto(proto), level="all", external_data=True)
    assert any(n.domain.startswith("com.microsoft") for n in optimized.graph)
    # the weights came back into memory: the model still runs after the temporary folder is gone
    assert verify(proto, optimized, dims={"N": 2}, rtol=1e-5, atol=1e-6).passed
