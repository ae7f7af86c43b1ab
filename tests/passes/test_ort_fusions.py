"""ort-fusions (level 3): ONNX Runtime's offline optimizations, persisted and marked as ORT-only."""

from __future__ import annotations

import numpy as np
import onnx
from mp_testing import assert_graph_equal, model_from_text, refusals
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
    assert verify(proto, model, dims={"N": 3}, input_sets=3, rtol=1e-5, atol=1e-6).passed


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
    assert_graph_equal(model, from_proto(proto))


def test_external_data_round_trip_through_ort():
    proto = conv_matmul_model()
    optimized = ort_optimize(from_proto(proto), level="all", external_data=True)
    assert any(n.domain.startswith("com.microsoft") for n in optimized.graph)
    # the weights came back into memory: the model still runs after the temporary folder is gone
    assert verify(proto, optimized, dims={"N": 2}, rtol=1e-5, atol=1e-6).passed


def test_extended_level_fuses_conv_and_relu_into_one_contrib_op():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) <float[4, 3, 1, 1] w = {1,2,3,4,5,6,7,8,9,10,11,12}, float[4] b = {1, 2, 3, 4}> {
      c = Conv<pads = [0, 0, 0, 0]>(x, w, b)
      y = Relu(c)
    }
    """
    model = model_from_text(text)
    p = OrtFusions()
    p.ort_level = "extended"  # portable: "all" picks an NCHWc block size for this CPU
    p(model)
    expected = from_proto(
        onnx.parser.parse_model(
            text.replace(
                "c = Conv<pads = [0, 0, 0, 0]>(x, w, b)\n      y = Relu(c)",
                'y = com.microsoft.FusedConv<activation = "Relu", auto_pad = "NOTSET", group = 1, pads = [0, 0, 0, 0]>(x, w, b)',
            ).replace('["" : 17]', '["" : 17, "com.microsoft" : 1]')
        )
    )
    # ORT imports every domain it knows; which ones depends on its version
    assert {"": 17, "com.microsoft": 1}.items() <= dict(model.opset_imports).items()
    expected.opset_imports.update(model.opset_imports)
    assert_graph_equal(model, expected)


def test_a_model_onnxruntime_cannot_load_is_left_as_it_is():
    text = """
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[2] x) => (float[2] y) {
      r = Relu(x)
      y = custom.Unknown(r)
    }
    """
    model = from_proto(onnx.parser.parse_model(text))
    reasons = refusals(model, "ort-fusions")
    assert len(reasons) == 1 and reasons[0].startswith("ONNX Runtime's optimizer failed:")
    assert_graph_equal(model, from_proto(onnx.parser.parse_model(text)))
