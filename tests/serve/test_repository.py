"""Model names, the batching rule read from the graph, and the CLI's one-line refusals."""

from __future__ import annotations

import pytest
from mp_testing import model_from_text
from serve_testing import cnn

from modelpress.cli.main import main
from modelpress.errors import OptionError
from modelpress.serve.repository import Repository, ServedModel, model_name

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def _served(graph: str) -> ServedModel:
    return ServedModel("m", model_from_text(HEAD + graph), session=None)


@pytest.mark.parametrize(
    ("graph", "batch_dim"),
    [
        ("g (float[N, 3] x, float[N, 2] y) => (float[N, 3] z) { z = Relu(x) }", "N"),
        # an output whose first axis is not the batch: NonZero indices
        ("g (float[N, 3] x) => (int64[2, K] z) { z = NonZero(x) }", None),
        # a fixed batch of 1
        ("g (float[1, 3] x) => (float[1, 3] z) { z = Relu(x) }", None),
        # inputs that do not share their first axis
        ("g (float[N, 3] x, float[M, 3] y) => (float[N, 3] z) { z = Relu(x) }", None),
        # a reduction over the batch
        (
            "g (float[N, 3] x) => (float[3] z) <int64[1] axes = {0}> { z = ReduceSum<keepdims=0>(x, axes) }",
            None,
        ),
    ],
)
def test_batch_dimension_is_one_named_axis_0_of_every_input_and_output(graph, batch_dim):
    assert _served(graph).batch_dim == batch_dim


def test_output_shapes_missing_from_the_file_are_inferred():
    from modelpress.ir import parse

    m = ServedModel("m", parse(HEAD + "g (float[batch, 4] x) => (z) { z = Relu(x) }"), session=None)
    assert m.outputs[0].shape == ("batch", 4) and m.batch_dim == "batch"


def test_names_come_from_the_file_or_the_user_and_must_be_unique_and_url_safe():
    assert model_name("/models/resnet50.int8.onnx") == "resnet50"
    assert model_name("/models/a.onnx", "fast-v2") == "fast-v2"
    with pytest.raises(OptionError, match="use letters, digits"):
        model_name("x.onnx", "bad name/1")
    m = _served("g (float[N, 3] x) => (float[N, 3] z) { z = Relu(x) }")
    with pytest.raises(OptionError, match="two models are named 'm'"):
        Repository([m, m])


def test_cli_refusals_are_one_line(tmp_path, capsys):
    path = str(cnn(tmp_path / "cnn.onnx"))
    cases = [
        (["serve", path, "--api-key-file", str(tmp_path / "absent")], "error: --api-key-file"),
        (["serve", path, "--name", "a,b"], "error: --name gives 2 names for 1 models"),
        (["serve", path, "--max-batch", "0"], "error: --max-batch must be at least 1"),
        (["serve", path, "--prefill-chunk", "0"], "error: --prefill-chunk must be at least 1"),
        (
            ["serve", path, path],
            "error: two models are named 'cnn': give them different --name values",
        ),
    ]
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    cases.append((["serve", path, "--api-key-file", str(empty)], "the file is empty"))
    for argv, message in cases:
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and message in err, err


def test_dimensions_written_as_minus_1_or_0_take_any_size():
    import numpy as np
    from onnx import TensorProto, helper

    from modelpress.ir import from_proto

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 0, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 0, 3])],
    )
    m = ServedModel("m", from_proto(helper.make_model(graph)), session=None)
    assert m.inputs[0].wire_shape() == [-1, -1, 3]
    feeds, rows, key = m.check({"x": np.zeros((5, 2, 3), np.float32)})
    # an unnamed axis 0 that the graph keeps per-sample batches (verify.batching): 5 rows, stacked
    # only with requests of the same other dimensions
    assert rows == 5 and key == ((2, 3),)
    with pytest.raises(Exception, match="expects \\[-1, -1, 3\\]"):
        m.check({"x": np.zeros((5, 2, 4), np.float32)})


def test_the_largest_valid_body_follows_from_fixed_input_sizes():
    from modelpress.serve.repository import HEADER_SLACK, JSON_CHARS_PER_VALUE

    m = _served("g (float[N, 3, 4] x, int64[N, 2] y) => (float[N, 3, 4] z) { z = Relu(x) }")
    # per row 12 + 2 values, each at most JSON_CHARS_PER_VALUE characters as JSON text
    assert m.max_body_bytes(5) == 5 * 14 * JSON_CHARS_PER_VALUE + HEADER_SLACK
    # not batched: one request is one run, whatever the rows
    m = _served("g (float[1, 3] x) => (float[1, 3] z) { z = Relu(x) }")
    assert m.max_body_bytes(64) == 3 * JSON_CHARS_PER_VALUE + HEADER_SLACK
    # a size per row that is not fixed (or strings): no bound from the model
    assert _served("g (float[N, L] x) => (float[N, L] z) { z = Relu(x) }").max_body_bytes(5) is None
    assert (
        _served("g (string[N, 2] x) => (string[N, 2] z) { z = Identity(x) }").max_body_bytes(5)
        is None
    )
