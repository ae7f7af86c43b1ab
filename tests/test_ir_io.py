"""Load and save: round trips (external data included), and bad files give one clear error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mp_testing import model_from_text

from modelpress.errors import ModelLoadError, ModelSaveError
from modelpress.ir import load, save
from modelpress.verify import verify

TEXT = """
<ir_version: 8, opset_import: ["" : 17], producer_name: "test"
 , metadata_props: ["author": "me"]>
agraph (float[N, 4] x) => (float[N, 3] y) <float[4, 3] W = {1,2,3,4,5,6,7,8,9,10,11,12}> {
  m = MatMul(x, W)
  y = Relu(m)
}
"""


def test_round_trip_keeps_metadata_opsets_and_dynamic_dims(tmp_path):
    model = model_from_text(TEXT)
    path = save(model, tmp_path / "m.onnx")
    back = load(path)
    assert back.opset_imports[""] == 17
    assert back.metadata_props["author"] == "me"
    assert str(back.graph.inputs[0].shape[0]) == "N"
    assert verify(model, back).passed


def test_external_data_round_trip(tmp_path):
    model = model_from_text(TEXT)
    path = save(model, tmp_path / "m.onnx", external_data=True, size_threshold=16)
    assert (tmp_path / "m.onnx.data").stat().st_size == 48
    proto = onnx.load(str(path), load_external_data=False)
    assert proto.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    back = load(path)
    w = back.graph.initializers["W"].const_value.numpy()
    np.testing.assert_array_equal(w.ravel(), np.arange(1, 13, dtype=np.float32))


def test_if_subgraph_survives_round_trip(tmp_path):
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (bool c, float[2] x) => (float[2] y) {
      y = If(c) <then_branch = g1 () => (float[2] a) { a = Relu(x) },
                 else_branch = g2 () => (float[2] b) { b = Neg(x) }>
    }
    """
    model = model_from_text(text)
    back = load(save(model, tmp_path / "if.onnx"))
    assert back.graph.node(0).op_type == "If"
    assert verify(
        model, back, data={"c": np.array(False), "x": np.array([1.0, -2.0], np.float32)}
    ).passed


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not an ONNX model"),
        (b"hello, this is text", "not a valid ONNX file"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, message):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message) as exc:
        load(p)
    assert "\n" not in str(exc.value) and str(p) in str(exc.value)


def test_truncated_file(tmp_path):
    good = save(model_from_text(TEXT), tmp_path / "m.onnx")
    data = good.read_bytes()
    bad = tmp_path / "t.onnx"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="t.onnx"):
        load(bad)


def test_invalid_graph(tmp_path):
    proto = onnx.parser.parse_model(TEXT)
    proto.graph.node[1].input[0] = "does_not_exist"
    p = tmp_path / "invalid.onnx"
    onnx.save(proto, str(p))
    with pytest.raises(ModelLoadError, match="invalid ONNX graph"):
        load(p)


def test_missing_file_and_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load(tmp_path / "nope.onnx")
    with pytest.raises(ModelSaveError, match="does not exist"):
        save(model_from_text(TEXT), tmp_path / "no_dir" / "m.onnx")
    assert not (tmp_path / "no_dir").exists()


def test_failed_save_leaves_existing_file_untouched(tmp_path, monkeypatch):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"precious")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(onnx, "save_model", boom)
    with pytest.raises(ModelSaveError, match="disk full"):
        save(model_from_text(TEXT), target)
    assert target.read_bytes() == b"precious"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize(
    "opset, scale",  # (Upsample only enlarges)
    [(9, (2.0, 2.0)), (9, (1.5, 1.7)), (10, (2.0, 2.0)), (10, (1.5, 1.7)), (10, (0.5, 0.6))],
)
def test_an_upgraded_legacy_resize_gives_the_same_pixels(opset, mode, scale):
    """Upsample-9 and Resize-10 map pixels asymmetrically and round down when upsampling (up when
    downsampling); ONNX's converter writes Resize-11's defaults instead. Compared in ORT."""
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto, to_proto
    from modelpress.ir.opset import upgrade_opset
    from modelpress.runtime.ort import session

    op = "Upsample" if opset == 9 else "Resize"
    scales = numpy_helper.from_array(np.array([1, 1, *scale], np.float32), "s")
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "s"], ["y"], mode=mode)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [scales],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 7
    x = {"x": np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)}
    want = session(proto).run(None, x)[0]
    upgraded = to_proto(upgrade_opset(from_proto(proto), 13))
    assert [n.op_type for n in upgraded.graph.node].count("Resize") == 1
    np.testing.assert_array_equal(session(upgraded).run(None, x)[0], want)
