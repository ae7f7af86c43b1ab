"""Calibration sources, bad data (one clear error, no output file), streaming."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import mlp, small_cnn

from modelpress.cli.main import main
from modelpress.compress import quantize
from modelpress.compress.quantize.calibration import CalibrationSet, ImagePreprocess, collect
from modelpress.compress.quantize.observers.minmax import MinMaxObserver
from modelpress.errors import InputError, OptionError
from modelpress.ir import save
from modelpress.runtime.processing import Processing


def test_npz_batches_and_labels(tmp_path, rng):
    x = rng.standard_normal((10, 16)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x, label=np.arange(10))
    cal = CalibrationSet.from_source(tmp_path / "c.npz", batch_size=4, labels_key="label")
    batches = list(cal.batches(mlp()))
    assert [b.feeds["x"].shape[0] for b in batches] == [4, 4, 2]
    assert batches[2].labels.tolist() == [8, 9]
    np.testing.assert_array_equal(np.concatenate([b.feeds["x"] for b in batches]), x)


def test_directory_of_npz_with_different_shapes(tmp_path, rng):
    model = small_cnn()  # spatial size is dynamic? no: fixed 8x8, batch dynamic
    for i, n in enumerate((2, 5)):
        np.savez(tmp_path / f"b{i}.npz", x=rng.standard_normal((n, 4, 8, 8)).astype(np.float32))
    cal = CalibrationSet.from_source(tmp_path)
    assert [b.feeds["x"].shape[0] for b in cal.batches(model)] == [2, 5]


def test_collect_streams_min_max_exactly(tmp_path, rng):
    model = mlp()
    xs = [rng.standard_normal((n, 16)).astype(np.float32) for n in (3, 7, 1)]
    obs = {"x": [MinMaxObserver()], "r1": [MinMaxObserver()]}
    calls = []
    n = collect(
        model,
        CalibrationSet.from_source([{"x": x} for x in xs]),
        obs,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert n == 3 and calls[-1] == (3, 3)
    allx = np.concatenate(xs)
    assert float(obs["x"][0].lo) == allx.min() and float(obs["x"][0].hi) == allx.max()
    assert float(obs["r1"][0].lo) == 0.0  # a Relu output


def test_image_folder(tmp_path, rng):
    from PIL import Image

    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (12, 10), dtype=np.uint8), mode="L").save(
            tmp_path / f"{i}.png"
        )
    pre = ImagePreprocess(
        size=(10, 10), crop=(8, 8), mean=(0.5,), std=(0.25,), mode="L", layout="NCHW"
    )
    from onnx import TensorProto, helper

    from modelpress.ir import from_proto

    g = helper.make_graph(
        [helper.make_node("Relu", ["img"], ["y"])],
        "g",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 8, 8])],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = from_proto(p)
    batches = list(CalibrationSet.from_source(tmp_path, image=pre, batch_size=2).batches(model))
    assert [b.feeds["img"].shape for b in batches] == [(2, 1, 8, 8), (1, 1, 8, 8)]
    img = np.asarray(Image.open(tmp_path / "0.png").resize((10, 10), Image.BILINEAR), np.float32)[
        1:9, 1:9
    ]
    np.testing.assert_allclose(
        batches[0].feeds["img"][0, 0], (img / 255 - 0.5) / 0.25, rtol=0, atol=1e-6
    )
    # nothing declared: the pre-processing the model's input declares (resize to 8x8), the one
    # `run` and `serve` apply
    (default,) = list(CalibrationSet.from_source(tmp_path, batch_size=4).batches(model))
    want = Processing.declare(model, pre="image").preprocess(
        [(tmp_path / f"{i}.png").read_bytes() for i in range(3)]
    )
    np.testing.assert_array_equal(default.feeds["img"], want["img"])
    # a crop larger than the image pads it with zeros, as `pipeline --pre image:crop=` does
    pre = ImagePreprocess(size=(6, 6), crop=(8, 8), mode="L")
    (padded,) = list(CalibrationSet.from_source(tmp_path, image=pre, batch_size=4).batches(model))
    assert padded.feeds["img"].shape == (3, 1, 8, 8)
    assert not padded.feeds["img"][:, :, 0].any() and padded.feeds["img"][:, :, 1:7, 1:7].any()
    dynamic = from_proto(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["img"], ["y"])],
                "g",
                [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 1, "H", "W"])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "H", "W"])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
    )
    with pytest.raises(OptionError, match="pre-processing"):
        list(CalibrationSet.from_source(tmp_path).batches(dynamic))


@pytest.mark.parametrize(
    "arrays,match",
    [
        ({"image": np.zeros((4, 4, 8, 8), np.float32)}, "'image' is not an input"),
        ({"x": np.zeros((4, 3, 8, 8), np.float32)}, "size 3 on axis 1"),
        ({"x": np.zeros((4, 4, 8, 8), np.float64)}, "dtype float64"),
        ({"x": np.zeros((4, 4, 8), np.float32)}, "rank 3"),
        ({"x": np.zeros((0, 4, 8, 8), np.float32)}, "empty"),
        # one NaN would make a NaN scale, and every output of the written model NaN
        (
            {
                "x": np.where(np.arange(256).reshape(1, 4, 8, 8) == 7, np.nan, 1.0)
                .repeat(4, 0)
                .astype(np.float32)
            },
            "4 NaN or infinite",
        ),
        ({"x": np.full((4, 4, 8, 8), np.inf, np.float32)}, "1024 NaN or infinite"),
    ],
)
def test_bad_calibration_data_one_error_no_output(tmp_path, capsys, arrays, match):
    model_path = tmp_path / "m.onnx"
    save(small_cnn(), model_path)
    np.savez(tmp_path / "calib.npz", **arrays)
    with pytest.raises(InputError, match=match):
        quantize(model_path, mode="static", data=tmp_path / "calib.npz")
    out = tmp_path / "q.onnx"
    code = main(
        ["quantize", str(model_path), "-o", str(out), "--calib", str(tmp_path / "calib.npz")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out.exists()
    assert len(err) == 1 and err[0].startswith("error: ") and "calib.npz" in err[0]


def test_empty_iterable_and_missing_paths(tmp_path):
    with pytest.raises(InputError, match="empty"):
        quantize(mlp(), mode="static", data=[])
    with pytest.raises(InputError, match="no such file"):
        quantize(mlp(), mode="static", data=tmp_path / "nope.npz")
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match="empty"):
        quantize(mlp(), mode="static", data=tmp_path / "d")
    with pytest.raises(OptionError, match="needs calibration"):
        quantize(mlp(), mode="static")
    with pytest.raises(InputError, match="labels key"):
        np.savez(tmp_path / "c.npz", x=np.zeros((2, 16), np.float32))
        quantize(mlp(), mode="static", data=tmp_path / "c.npz", labels_key="label")


def test_one_shot_iterator_is_refused_on_second_full_pass():
    from modelpress.compress.quantize.calibration import REPLAY

    gen = ({"x": np.full((2, 16), i, np.float32)} for i in range(REPLAY + 2))
    cal = CalibrationSet.from_source(gen)
    assert len(list(cal.batches(mlp()))) == REPLAY + 2
    # later passes that read a few batches get the first ones again, from memory
    assert [b.feeds["x"][0, 0] for b in cal.batches(mlp(), limit=3)] == [0, 1, 2]
    with pytest.raises(OptionError, match="already consumed"):
        list(cal.batches(mlp()))
    with pytest.raises(OptionError, match="already consumed"):
        list(cal.batches(mlp(), limit=REPLAY + 1))


def test_static_quantization_from_a_generator(rng):
    """A generator is read once, by calibration; the error report and the measured bias
    correction reuse its first batches."""

    for n in (1, 9):  # fewer batches than are kept, and more
        data = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(n)]
        r = quantize(small_cnn(), mode="static", data=(d for d in data), optimize=False)
        ref = quantize(small_cnn(), mode="static", data=data, optimize=False)
        assert r.output_error is not None and r.output_error == pytest.approx(ref.output_error)


def test_all_zero_calibration_data_is_refused(tmp_path):
    from quant_models import small_cnn

    from modelpress.compress import quantize
    from modelpress.errors import InputError

    zeros = [{"x": np.zeros((4, 4, 8, 8), np.float32)} for _ in range(2)]
    with pytest.raises(InputError, match="every input is zero in every sample"):
        quantize(small_cnn(), mode="static", data=zeros)


def test_old_argument_names_still_work_with_a_warning(rng):
    x = [{"x": rng.standard_normal((4, 16)).astype(np.float32)}]
    new = quantize(mlp(), mode="static", data=x, limit=4)
    with pytest.warns(DeprecationWarning, match="`calibration` is renamed `data`"):
        old = quantize(mlp(), mode="static", calibration=x, calibration_limit=4)
    assert [n.op_type for n in old.model.graph] == [n.op_type for n in new.model.graph]
    with pytest.raises(OptionError, match="old name of `data`"):
        quantize(mlp(), mode="static", data=x, calibration=x)
