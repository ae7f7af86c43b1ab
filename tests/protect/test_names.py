"""Names: every name in the obfuscated model is a fresh random token (the interface kept unless
asked), doc strings, metadata and intermediate shapes are gone, and nothing collides."""

from __future__ import annotations

import onnx
from mp_testing import model_from_text

from modelpress.protect import open_package, protect
from modelpress.protect.names import all_names

MODEL = """<ir_version: 8, opset_import: ["" : 17], producer_name: "secret-trainer", doc_string: "our proprietary model">
the_secret_graph (float[2, 300] image_in) => (float[2, 300] scores_out) <float[300] layer1_weight = {W}> {
    layer1_scaled = Mul(image_in, layer1_weight)
    layer1_activation = Relu(layer1_scaled)
    scores_out = Sigmoid(layer1_activation)
}"""


def _model():
    model = model_from_text(MODEL.replace("{W}", "{" + ", ".join(["0.25"] * 300) + "}"))
    model.metadata_props["trained_on"] = "customer_dataset_v3"
    return model


def _obfuscated(model, key, **options) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(
        protect(model, key=key, obfuscate=True, encrypt=False, verify=False, **options).data
    )


def test_nothing_of_the_original_names_survives(key):
    model = _model()
    obf = _obfuscated(model, key, ratio=1.0)
    g = obf.graph
    # the interface, then the inputs whose values the runtime supplies (random names)
    assert g.input[0].name == "image_in" and [v.name for v in g.output] == ["scores_out"]
    assert not {v.name for v in g.input[1:]} & all_names(model)
    names = (
        {g.name}
        | {n.name for n in g.node}
        | {o for n in g.node for o in n.output}
        | {t.name for t in g.initializer}
    )
    assert len(names) == len(set(names))
    internal = all_names(model) - {"image_in", "scores_out"}
    assert not names & internal
    # no shapes of intermediate values (a stored tensor's type is its own, written again)
    assert {v.name for v in g.value_info} <= {t.name for t in g.initializer}
    assert not obf.doc_string and obf.producer_name == "modelpress"
    assert {p.key for p in obf.metadata_props} == {"modelpress.protect", "modelpress.signature"}
    data = obf.SerializeToString()
    for secret in [
        b"secret-trainer",
        b"proprietary",
        b"customer_dataset",
        b"layer1",
        b"the_secret_graph",
        b"Relu",
        b"Sigmoid",
    ]:
        assert secret not in data


def test_renamed_interface_comes_back_when_opened(key):
    model = _model()
    obf = _obfuscated(model, key, rename_io=True)
    assert {v.name for v in [*obf.graph.input, *obf.graph.output]}.isdisjoint(
        {"image_in", "scores_out"}
    )
    for mode in ("runtime", "storage"):
        result = protect(model, key=key, obfuscate=True, rename_io=True, mode=mode, verify=False)
        opened = open_package(result.data, key)
        given = opened.graph.initializers  # the run-time values: inputs with a value
        assert [v.name for v in opened.graph.inputs if v.name not in given] == ["image_in"]
        assert [v.name for v in opened.graph.outputs] == ["scores_out"]
        assert opened.metadata_props["trained_on"] == "customer_dataset_v3"
