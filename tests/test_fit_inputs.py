"""Generated inputs fit the model: every dynamic spelling, sizes the original can run at, honest
messages when it cannot, and no allocation beyond a budget.

Each test reproduces a failure seen on real exports (a Paddle ``-1`` batch ending in a traceback, a
reflection pad longer than a 2-sample input reported as a failed optimization, a detector whose
2x2 feature maps do not line up, petabyte allocations for absurd dims, an empty input set that
passed), checks the one-line outcome, and checks the written model against ONNX Runtime on the
original.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelpress.cli.main import main
from modelpress.errors import InputError
from modelpress.ir import from_proto, load, save
from modelpress.verify import run_model, verify
from modelpress.verify.fit import CANDIDATES, fit_inputs
from modelpress.verify.inputs import generate_inputs


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err + captured.out
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def paddle_like(dim0) -> onnx.ModelProto:
    """x[dim0, 3, 4, 4] -> Identity -> Relu, the batch written as Paddle and others write it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim0, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim0, 3, 4, 4])
    return _model(
        [helper.make_node("Identity", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        [x],
        [y],
    )


@pytest.mark.parametrize(
    "dim0", [-1, 0, None, "batch"], ids=["minus-one", "zero", "empty", "named"]
)
def test_every_spelling_of_a_dynamic_dim_is_dynamic(dim0, tmp_path, capsys):
    proto = paddle_like(dim0)
    if dim0 is None:
        proto.graph.input[0].type.tensor_type.shape.dim[0].Clear()
        proto.graph.output[0].type.tensor_type.shape.dim[0].Clear()
    src = tmp_path / "m.onnx"
    src.write_bytes(proto.SerializeToString())
    # before: ValueError("negative dimensions are not allowed") from numpy, as a traceback
    feeds = generate_inputs(load(src))
    out = tmp_path / "o.onnx"
    if dim0 == 0:
        # ONNX Runtime reads a declared 0 literally (only empty tensors fit): generated as written
        assert feeds["x"].shape == (0, 3, 4, 4)
        assert main(["optimize", str(src), "-o", str(out)]) == 0
        return
    assert feeds["x"].shape == (2, 3, 4, 4)
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    x = np.random.default_rng(0).standard_normal((5, 3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_model(load(out), {"x": x})["y"], np.maximum(x, 0))


def reflect_pad(pad: int = 32) -> onnx.ModelProto:
    """An STFT-style front end: x[N, T] padded by reflection on both sides (needs T > pad)."""
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [0, pad, 0, pad])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T2"])
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Pad", ["i", "pads"], ["p"], mode="reflect"),
        helper.make_node("Mul", ["p", "two"], ["y"]),
    ]
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    return _model(nodes, [x], [y], [pads, two])


def test_sizes_grow_until_the_original_runs(tmp_path, capsys):
    src = tmp_path / "stft.onnx"
    src.write_bytes(reflect_pad(32).SerializeToString())
    out = tmp_path / "fast.onnx"
    # before: "the model failed to run: ... Pad reflect: post-pad (32) exceeds maximum allowed",
    # a correct optimization reported as a failure
    assert main(["optimize", str(src), "-o", str(out), "--json", str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert "size 128" in err and "fails at 2 and 8 and 32" in err  # which sizes, and why
    import json

    verify_record = json.loads((tmp_path / "r.json").read_text())["result"]["verify"]
    assert verify_record["shapes"] == {"x": [1, 128]} and verify_record["passed"]
    x = np.random.default_rng(1).standard_normal((3, 50)).astype(np.float32)
    expected = 2 * np.pad(x, ((0, 0), (32, 32)), mode="reflect")
    np.testing.assert_allclose(run_model(load(out), {"x": x})["y"], expected, rtol=1e-6)


def test_sizes_the_user_gave_are_kept(tmp_path, capsys):
    model = from_proto(reflect_pad(32))
    calls = []

    def run(feeds):
        calls.append(feeds["x"].shape)
        return run_model(model, feeds)

    fitted = fit_inputs(model, run, dims={"T": 40}, input_sets=1)
    assert calls == [(2, 40)] and fitted.failed == [] and fitted.note is None


def test_an_original_that_never_runs_is_named_not_the_transformation(tmp_path, capsys):
    # an integer input that must be a real sample rate (16000): it sets the number of frames, and
    # generated 0/1 values give 0 frames of a non-empty signal, whatever the size
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    nodes = [
        helper.make_node("Div", ["sr", "k"], ["frames"]),  # 16000 / 4000 = 4 frames
        helper.make_node("Unsqueeze", ["frames", "ax"], ["frames1"]),
        helper.make_node("Concat", ["frames1", "minus"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1),
    ]
    inits = [
        helper.make_tensor("k", TensorProto.INT64, [], [4000]),
        helper.make_tensor("ax", TensorProto.INT64, [1], [0]),
        helper.make_tensor("minus", TensorProto.INT64, [1], [-1]),
    ]
    proto = _model(nodes, [x, sr], [y], inits)
    src = tmp_path / "vad.onnx"
    src.write_bytes(proto.SerializeToString())
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out)]) == 1
    err = _one_error_line(capsys)
    assert "the original model cannot run on generated inputs" in err
    assert "--data" in err and "--dim" in err and "`" not in err  # flags, not the API's fields
    assert not out.exists()
    with pytest.raises(InputError, match=r"`inputs`"):  # the API names its own keywords
        verify(load(src), load(src))
    # with real inputs it verifies
    feeds = {"x": np.ones((2, 16), np.float32), "sr": np.array(16000, np.int64)}
    np.savez(tmp_path / "real.npz", **feeds)
    assert main(["optimize", str(src), "-o", str(out), "--data", str(tmp_path / "real.npz")]) == 0
    np.testing.assert_array_equal(run_model(load(out), feeds)["y"], np.ones((4, 8), np.float32))


def detector(channels: int = 4) -> onnx.ModelProto:
    """A feature-pyramid step: stride-2 Conv twice down, Resize x4 up, Add to the input's features.
    At odd or tiny sizes the two paths disagree in size (as a YOLO neck does)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
    inits = [
        onnx.numpy_helper.from_array(w, "w"),
        onnx.numpy_helper.from_array(w2, "w2"),
        onnx.numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "scales"),
    ]
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)
    nodes = [
        helper.make_node("Conv", ["images", "w"], ["f"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["f", "w2"], ["d1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d1", "w2"], ["d2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["d2", "", "scales"], ["u"], mode="nearest"),
        helper.make_node("Add", ["f", "u"], ["y"]),
    ]
    return _model(nodes, [x], [y], inits)


def test_bench_on_dynamic_height_and_width_picks_sizes_that_run(tmp_path, capsys):
    src = tmp_path / "det.onnx"
    src.write_bytes(detector().SerializeToString())
    # before: "the model failed to run" (2x2 images: the Add's shapes disagree), as a traceback
    assert (
        main(
            ["bench", str(src), "--runs", "2", "--warmup", "0", "--json", str(tmp_path / "b.json")]
        )
        == 0
    )
    import json

    result = json.loads((tmp_path / "b.json").read_text())["result"]
    assert result["shapes"] == {"images": [1, 3, 8, 8]} and "fails at 2" in result["notes"][0]
    # the same sizes, given by the user, are taken as they are
    assert (
        main(
            [
                "bench",
                str(src),
                "--runs",
                "2",
                "--warmup",
                "0",
                "--dim",
                "height=16",
                "--dim",
                "width=16",
            ]
        )
        == 0
    )
    assert "1 interleaved" not in capsys.readouterr().out


def test_absurd_declared_dims_are_refused_before_allocating(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [10**9, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [10**9, 256])
    src = tmp_path / "huge.onnx"
    src.write_bytes(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]).SerializeToString())
    # before: MemoryError("Unable to allocate 1.86 TiB ...") as a traceback
    for argv in (
        ["optimize", str(src), "-o", str(tmp_path / "o.onnx")],
        ["verify", str(src), str(src)],
        ["bench", str(src)],
    ):
        assert main(argv) == 1
        err = _one_error_line(capsys)
        assert (
            "input 'x' would take 953.7 GiB at shape [1000000000, 256]" in err and "--data" in err
        )


def test_verify_on_an_empty_input_set_is_an_error_not_a_pass(tmp_path, capsys):
    src = save(from_proto(paddle_like("N")), tmp_path / "m.onnx")
    np.savez(tmp_path / "empty.npz")
    # before: PASS over 1 input set(s), with no output compared
    assert main(["verify", str(src), str(src), "--data", str(tmp_path / "empty.npz")]) == 1
    assert "--data is empty" in _one_error_line(capsys)
    with pytest.raises(InputError, match="empty"):
        verify(src, src, data=[])


@pytest.mark.parametrize("kind", ["truncated", "npy", "directory"])
def test_bad_data_files_are_one_line(kind, tmp_path, capsys):
    src = save(from_proto(paddle_like("N")), tmp_path / "m.onnx")
    x = np.zeros((64, 3, 4, 4), np.float32)
    if kind == "truncated":
        np.savez(tmp_path / "full.npz", x=x)
        data = tmp_path / "bad.npz"
        data.write_bytes((tmp_path / "full.npz").read_bytes()[:1000])
    elif kind == "npy":
        data = tmp_path / "x.npy"
        np.save(data, x)
    else:
        data = tmp_path
    # before: BadZipFile / TypeError tracebacks
    for argv in (
        ["verify", str(src), str(src)],
        ["optimize", str(src), "-o", str(tmp_path / "o.onnx")],
        ["bench", str(src)],
    ):
        assert main([*argv, "--data", str(data)]) == 1
        assert str(data.name) in _one_error_line(capsys)


def test_the_ladder_starts_at_the_historical_default():
    assert CANDIDATES[0] == (2, 2)


def tied_state_and_rate() -> onnx.ModelProto:
    """silero-vad's contract in small: a signal x[?, ?], a recurrent state[2, ?, 4] whose second
    axis is x's batch (Concat along axis 1 needs both batches equal), and a sample rate ``sr`` that
    selects a branch: only ``sr == 16000`` runs, any other value reaches a Reshape that cannot."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 4])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, [None, 5])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, [None, 5])
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["cat"], ["t"])], "then", [], [then_out]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Reshape", ["cat", "bad"], ["e"])], "else", [], [else_out]
    )
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["xp"], mode="reflect"),  # needs T > 4, as STFTs do
        helper.make_node("ReduceSum", ["xp", "ax1"], ["xs"], keepdims=1),  # [B, 1]
        helper.make_node("ReduceSum", ["state", "ax0"], ["ss"], keepdims=0),  # [B, 4]
        helper.make_node("Concat", ["xs", "ss"], ["cat"], axis=1),  # [B, 5]
        helper.make_node("Constant", [], ["rate"], value_int=16000),
        helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["y"], then_branch=then_branch, else_branch=else_branch),
    ]
    inits = [
        helper.make_tensor("ax0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ax1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("bad", TensorProto.INT64, [2], [7, 11]),
        helper.make_tensor("pads", TensorProto.INT64, [4], [0, 4, 0, 4]),
    ]
    return _model(nodes, [x, state, sr], [y], inits)


def test_anonymous_dims_tied_by_the_graph_and_compared_scalars(tmp_path, capsys):
    src = tmp_path / "vad.onnx"
    src.write_bytes(tied_state_and_rate().SerializeToString())
    model = load(src)
    feeds = generate_inputs(model)
    assert feeds["sr"].dtype == np.int64 and int(feeds["sr"]) == 16000  # before: 0 or 1
    # before: "the original model cannot run on generated inputs" (x's batch 1, state's 8)
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--json", str(tmp_path / "r.json")]) == 0
    import json

    record = json.loads((tmp_path / "r.json").read_text())["result"]["verify"]
    assert record["passed"] and "tied to it: state[1]" in capsys.readouterr().err
    assert record["shapes"] == {"x": [1, 8], "state": [2, 1, 4], "sr": []}
    assert main(["verify", str(src), str(out)]) == 0
    real = {
        "x": np.arange(18, dtype=np.float32).reshape(3, 6),
        "state": np.ones((2, 3, 4), np.float32),
        "sr": np.array(16000, np.int64),
    }
    padded = np.pad(real["x"], ((0, 0), (4, 4)), mode="reflect")
    expected = np.concatenate([padded.sum(1, keepdims=True), np.full((3, 4), 2.0)], axis=1)
    np.testing.assert_array_equal(run_model(load(out), real)["y"], expected)


def _silero_file():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("silero-vad is not installed (the `corpus` extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path


def test_silero_vad_verifies_and_optimizes_without_data(tmp_path, capsys):
    src = _silero_file()
    out = tmp_path / "vad.onnx"
    # before: "the original model cannot run on generated inputs ... LSTM node" (batches disagree)
    assert main(["optimize", str(src), "-o", str(out), "--json", str(tmp_path / "r.json")]) == 0
    import json

    record = json.loads((tmp_path / "r.json").read_text())["result"]["verify"]
    assert record["passed"] and record["shapes"]["state"][1] == record["shapes"]["input"][0]
    assert main(["verify", str(src), str(out)]) == 0
