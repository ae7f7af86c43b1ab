"""Bad files and odd models, each once a traceback or a silent pass: a model that declares a zero
batch in ``run``, an ``.npz`` with an empty batch in ``verify``/``optimize``, labels beside the
inputs in ``run``, and a ``--json`` record into a folder that does not exist (nothing written)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelpress.cli.main import main


def _relu(path, dim0) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim0, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim0, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _matmul(path) -> str:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [x],
        [y],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _error(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, captured.err
    return lines[0]


def test_run_on_a_model_that_declares_a_zero_batch_is_one_line(tmp_path, capsys):
    model = _relu(tmp_path / "zero.onnx", 0)
    np.savez(tmp_path / "x.npz", x=np.ones((4, 3), np.float32))
    out = tmp_path / "p.jsonl"
    # before: onnxruntime's InvalidArgument ("Got: 4 Expected: 0") as a traceback
    assert main(["run", model, str(tmp_path / "x.npz"), "-o", str(out)]) == 1
    assert "input 'x' has size 4 on axis 0, where the model declares 0" in _error(capsys)
    assert not out.exists() and not list(tmp_path.glob("p.jsonl*"))


@pytest.mark.parametrize("command", ["verify", "optimize"])
def test_an_empty_batch_is_not_a_pass(command, tmp_path, capsys):
    model = _relu(tmp_path / "m.onnx", "N")
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 3), np.float32))
    out = tmp_path / "o.onnx"
    argv = [command, model] + ([model] if command == "verify" else ["-o", str(out)])
    # before: "PASS over 1 input set(s)" on outputs of shape [0, 3], and the model written
    assert main([*argv, "--data", str(tmp_path / "empty.npz")]) == 1
    assert "input 'x' is an empty batch (shape [0, 3])" in _error(capsys)
    assert not out.exists()


def test_a_declared_zero_batch_still_verifies_on_empty_inputs(tmp_path, capsys):
    model = _relu(tmp_path / "zero.onnx", 0)
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 3), np.float32))
    assert main(["verify", model, model, "--data", str(tmp_path / "empty.npz")]) == 0


def test_run_leaves_the_labels_of_a_training_file_out(tmp_path, capsys):
    model = _relu(tmp_path / "m.onnx", "N")
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.savez(tmp_path / "train.npz", x=x, labels=np.arange(5), y_true=np.arange(5))
    out = tmp_path / "p.npz"
    # before: "'labels' is not an input of the model"
    argv = ["run", model, str(tmp_path / "train.npz"), "-o", str(out), "--batch-size", "2"]
    assert main([*argv, "--labels-key", "y_true"]) == 1  # the other array is still not an input
    assert "'labels' is not an input" in _error(capsys)
    np.savez(tmp_path / "train.npz", x=x, labels=np.arange(5))
    assert main(argv) == 0
    assert "array 'labels' left out" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out)["y"], np.maximum(x, 0))
    assert main([*argv, "--labels-key", "target"]) == 1
    assert "no array named 'target'" in _error(capsys)


@pytest.mark.parametrize("command", ["quantize", "optimize"])
def test_a_record_into_a_missing_folder_writes_nothing(command, tmp_path, capsys):
    model = _matmul(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    record = tmp_path / "missing" / "r.json"
    extra = ["--mode", "dynamic"] if command == "quantize" else []
    # before: the model written, then "output directory ... does not exist"
    assert main([command, model, "-o", str(out), *extra, "--json", str(record)]) == 1
    assert "output directory" in _error(capsys)
    assert not out.exists()
    assert main([command, model, "-o", str(out), *extra, "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["command"] == command


@pytest.mark.parametrize("command", ["optimize", "quantize"])
def test_optimize_and_quantize_open_a_package_with_its_key(command, tmp_path, capsys):
    model = _matmul(tmp_path / "m.onnx")
    key, package = tmp_path / "key.bin", tmp_path / "m.mpk"
    assert main(["keygen", "-o", str(key)]) == 0
    assert main(["protect", model, "-o", str(package), "--key-file", str(key)]) == 0
    out = tmp_path / "o.onnx"
    extra = ["--mode", "dynamic"] if command == "quantize" else []
    # before: "unrecognized arguments: --key-file", although the help offered it
    assert main([command, str(package), "-o", str(out), *extra, "--key-file", str(key)]) == 0
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert main(["run", str(out), str(tmp_path / "x.npz"), "-o", str(tmp_path / "p.npz")]) == 0
    w = onnx.numpy_helper.to_array(onnx.load(model).graph.initializer[0])
    tol = 1e-5 if command == "optimize" else 0.05  # int8 weights: a few per cent of the range
    np.testing.assert_allclose(np.load(tmp_path / "p.npz")["y"], x @ w, rtol=0, atol=tol * 8)
    capsys.readouterr()
    assert main([command, str(package), "-o", str(out), *extra]) == 1  # no key: one line
    assert "give its key with --key-file" in _error(capsys)


def test_piped_output_is_not_cut_at_80_columns(tmp_path):
    import os
    import subprocess
    import sys

    folder = tmp_path / ("a-long-folder-name-" * 6)
    folder.mkdir()
    model = _relu(folder / "m.onnx", "N")
    np.savez(folder / "x.npz", x=np.ones((2, 3), np.float32))
    out = folder / "predictions.npz"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-m", "modelpress.cli.main", "run", model, str(folder / "x.npz")]
        + ["-o", str(out), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # before: the line wrapped at 80 columns, the path split across two lines
    assert f"wrote {out}: 2 item(s)" in done.stdout.splitlines()[0]


def test_advise_on_unnamed_and_tied_dimensions_is_one_line(tmp_path, capsys):
    # silero-vad's shape: a signal x[?, ?] and a state[2, ?, 4] holding x's batch on axis 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])
    axes = [helper.make_tensor("ax0", 7, [1], [0]), helper.make_tensor("ax1", 7, [1], [1])]
    nodes = [
        helper.make_node("ReduceSum", ["x", "ax1"], ["xs"], keepdims=1),
        helper.make_node("ReduceSum", ["state", "ax0"], ["ss"], keepdims=0),
        helper.make_node("Concat", ["xs", "ss"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "g", [x, state], [y], axes)
    path = tmp_path / "vad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    # before: "give --dim None=SIZE", a flag value that cannot name an unnamed dimension
    assert main(["advise", str(path)]) == 1
    assert "give its shape in --shape (x=1xSIZE)" in _error(capsys)
    # before: ONNX Runtime's error as a traceback (the state's batch took the --seq size)
    assert main(["advise", str(path), "--seq", "8"]) == 1
    err = _error(capsys)
    assert "the model does not run at the input shapes x=1x8, state=2x8x4" in err
    assert main(["advise", str(path), "--shape", "x=1x8", "--shape", "state=2x1x4"]) == 0
