"""TensorFlow/Keras → ONNX: Keras files, SavedModels and TFLite convert and match TensorFlow.

TensorFlow is slow to import and to trace, so the models are built once per module. Each test
checks the written ONNX file against TensorFlow on fresh inputs (ONNX Runtime, optimizations off),
besides the verification ``convert`` itself runs, and the structure the conversion must produce
(a ``Loop`` for ``tf.while_loop``, an RNN op for a Keras LSTM).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("tf2onnx")

from modelpress.cli.main import main  # noqa: E402
from modelpress.convert import ConversionError, convert  # noqa: E402
from modelpress.ir import load  # noqa: E402
from modelpress.ir.stats import iter_nodes  # noqa: E402
from modelpress.verify import run_model  # noqa: E402

RNG = np.random.default_rng(0)


def _check(path, feeds: dict[str, np.ndarray], expected: list[np.ndarray], rtol=1e-4):
    got = list(run_model(load(path), feeds).values())
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=False):
        scale = max(float(np.abs(e).max()), 1e-6)
        np.testing.assert_allclose(g, e, rtol=0, atol=rtol * scale)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tf")


@pytest.fixture(scope="module")
def cnn(workdir):
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.Add()([x, y])
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(5, name="logits")(x)
    model = keras.Model(inp, out)
    # non-trivial BatchNorm statistics, so a wrong conversion of it shows
    bn = model.layers[2]
    gamma, beta, mean, var = bn.get_weights()
    bn.set_weights([gamma * 1.5, beta + 0.2, RNG.uniform(-0.5, 0.5, 8), RNG.uniform(0.5, 2, 8)])
    path = workdir / "cnn.keras"
    model.save(path)
    return model, path


def test_keras_functional_cnn_cli(cnn, workdir, capsys):
    model, src = cnn
    out = workdir / "cnn.onnx"
    assert main(["convert", str(src), "-o", str(out), "--optimize"]) == 0
    text = capsys.readouterr().out
    assert "keras" in text and "optimized ONNX vs original" in text
    x = RNG.standard_normal((3, 12, 12, 3)).astype(np.float32)
    _check(out, {"image": x}, [model(x, training=False).numpy()])


def test_keras_h5_and_in_memory(cnn, workdir):
    model, _ = cnn
    h5 = workdir / "cnn.h5"
    model.save(h5)
    r = convert(h5, inputs={"image": (4, 12, 12, 3)})
    assert r.source_kind == "keras" and r.verify.passed
    assert [d for d in r.model.graph.inputs[0].shape] == [4, 12, 12, 3]
    r2 = convert(model)
    assert r2.source_kind == "keras-model" and r2.verify.passed


def test_keras_lstm(workdir):
    keras.utils.set_random_seed(1)
    inp = keras.Input((6, 4), name="seq")
    x = keras.layers.LSTM(8)(inp)
    out = keras.layers.Dense(2)(x)
    model = keras.Model(inp, out)
    out_path = workdir / "lstm.onnx"
    r = convert(model, output=out_path)
    assert r.verify.passed
    ops = {n.op_type for n in iter_nodes(load(out_path).graph)}
    assert "LSTM" in ops, ops  # tf2onnx recognises the Keras LSTM: one ONNX LSTM, not unrolled
    x = RNG.standard_normal((5, 6, 4)).astype(np.float32)
    _check(out_path, {"seq": x}, [model(x, training=False).numpy()])


class _WhileModel(tf.Module):
    """Iterates x <- 0.5 * tanh(x @ w) + x a data-given number of times: a tf.while_loop."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.constant(RNG.standard_normal((4, 4)).astype(np.float32) * 0.3))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4], tf.float32, name="x"),
            tf.TensorSpec([], tf.int32, name="steps"),
        ]
    )
    def __call__(self, x, steps):
        i = tf.constant(0)
        _, y = tf.while_loop(
            lambda i, y: i < steps, lambda i, y: (i + 1, 0.5 * tf.tanh(y @ self.w) + y), (i, x)
        )
        return {"y": y}


def test_saved_model_while_loop(workdir):
    m = _WhileModel()
    src = workdir / "while_sm"
    tf.saved_model.save(m, str(src), signatures=m.__call__.get_concrete_function())
    out = workdir / "while.onnx"
    r = convert(src, output=out)
    assert r.source_kind == "savedmodel" and r.verify.passed
    assert "Loop" in {n.op_type for n in iter_nodes(load(out).graph)}
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for steps in (0, 2, 7):
        feeds = {"steps": np.array(steps, np.int32), "x": x}
        _check(out, feeds, [m(x, tf.constant(steps))["y"].numpy()])


class _TwoInputs(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.constant(RNG.standard_normal((4, 3)).astype(np.float32)))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4], tf.float32, name="features"),
            tf.TensorSpec([None, 3], tf.float32, name="bias"),
            tf.TensorSpec([None], tf.int32, name="label"),
        ]
    )
    def __call__(self, features, bias, label):
        logits = features @ self.w + bias
        return {"logits": logits, "picked": tf.gather(logits, label, axis=1, batch_dims=1)}


def test_saved_model_several_inputs_cli(workdir, capsys):
    m = _TwoInputs()
    src = workdir / "multi_sm"
    tf.saved_model.save(m, str(src), signatures=m.__call__.get_concrete_function())
    out = workdir / "multi.onnx"
    assert (
        main(
            [
                "convert",
                str(src),
                "-o",
                str(out),
                "--input",
                "features=5x4",
                "--input",
                "bias=5x3",
                "--input",
                "label=5:int32",
            ]
        )
        == 0
    )
    capsys.readouterr()
    model = load(out)
    assert sorted(v.name for v in model.graph.inputs) == ["bias", "features", "label"]
    assert [v.name for v in model.graph.outputs] == ["logits", "picked"]
    feeds = {
        "features": RNG.standard_normal((5, 4)).astype(np.float32),
        "bias": RNG.standard_normal((5, 3)).astype(np.float32),
        "label": np.array([0, 2, 1, 1, 0], np.int32),
    }
    expected = m(**{k: tf.constant(v) for k, v in feeds.items()})
    _check(out, feeds, [expected["logits"].numpy(), expected["picked"].numpy()])


def test_tflite(cnn, workdir):
    model, _ = cnn
    src = workdir / "cnn.tflite"
    src.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    out = workdir / "tflite.onnx"
    r = convert(src, output=out)
    assert r.source_kind == "tflite" and r.verify.passed
    x = RNG.standard_normal((1, 12, 12, 3)).astype(np.float32)
    name = load(out).graph.inputs[0].name
    # the TFLite model computes the Keras model (TFLite's own kernels round differently: 1e-4)
    _check(out, {name: x}, [model(x, training=False).numpy()])


def test_saved_model_without_signatures(workdir, capsys):
    module = tf.Module()
    module.v = tf.Variable(1.0)
    src = workdir / "nosig_sm"
    tf.saved_model.save(module, str(src))
    out = workdir / "nosig.onnx"
    assert main(["convert", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no signatures" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_corrupted_keras_and_tflite(workdir):
    bad = workdir / "bad.keras"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ConversionError, match="bad.keras: not a readable Keras model"):
        convert(bad)
    bad_tfl = workdir / "bad.tflite"
    bad_tfl.write_bytes(b"\x00" * 64)
    with pytest.raises(ConversionError, match="bad.tflite: not a readable TFLite model"):
        convert(bad_tfl)


class _Spectral(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([3, 3], tf.float32, name="x")])
    def __call__(self, x):
        with tf.name_scope("spectral"):
            values, _ = tf.linalg.eigh(x @ tf.transpose(x))
        return {"values": values}


def test_unsupported_tf_op_names_op_and_node(workdir):
    m = _Spectral()
    src = workdir / "eigh_sm"
    tf.saved_model.save(m, str(src), signatures=m.__call__.get_concrete_function())
    out = workdir / "eigh.onnx"
    with pytest.raises(ConversionError) as info:
        convert(src, output=out)
    msg = str(info.value)
    assert "\n" not in msg and "SelfAdjointEigV2" in msg and "spectral" in msg and "`opset`" in msg
    assert not out.exists()


def test_damaged_tflite_is_one_error_line_not_a_crash(workdir, capsys):
    """A flatbuffer with one wrong byte crashed the TFLite interpreter (SIGSEGV) in convert's own
    process, and truncated ones made it allocate without bound: the first contact now happens in a
    child process with a memory limit, and the command ends in one error line."""
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((12, 12, 3))
    x = tf.keras.layers.Conv2D(8, 3, activation="relu")(inp)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    keras_model = tf.keras.Model(inp, tf.keras.layers.Dense(4)(x))
    data = bytearray(tf.lite.TFLiteConverter.from_keras_model(keras_model).convert())
    data[483] = 194  # an offset in the subgraph table: the interpreter follows it into the void
    bad = workdir / "damaged.tflite"
    bad.write_bytes(bytes(data))
    out = workdir / "damaged.onnx"
    assert main(["convert", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "damaged.tflite: not a readable TFLite model" in err
    assert not out.exists()
