"""The converter registry and option parsing: detection by path, specs, and missing extras."""

from __future__ import annotations

import sys

import pytest

from modelpress.convert import (
    ConversionError,
    InputSpec,
    convert,
    detect,
    parse_dynamic,
    parse_input_specs,
)
from modelpress.errors import MissingExtraError, OptionError


def test_parse_input_specs():
    assert parse_input_specs(["x=1x3x32x32", "ids=2x16:int64", "n=:int32"]) == {
        "x": InputSpec((1, 3, 32, 32)),
        "ids": InputSpec((2, 16), "int64"),
        "n": InputSpec((), "int32"),
    }
    for bad in ("x", "x=1xax3", "x=1x3:complex7"):
        with pytest.raises(OptionError, match="`inputs`"):
            parse_input_specs([bad])


def test_parse_dynamic():
    assert parse_dynamic(["x:0", "x:2", "ids:1"]) == {"x": (0, 2), "ids": (1,)}
    for bad in ("x", "x:a", ":0"):
        with pytest.raises(OptionError, match="`dynamic`"):
            parse_dynamic([bad])


@pytest.mark.parametrize(
    "name, kind",
    [
        ("m.pt2", "pt2"),
        ("m.pt", "torchscript"),
        ("m.keras", "keras"),
        ("m.h5", "keras"),
        ("m.tflite", "tflite"),
    ],
)
def test_detect_by_suffix(tmp_path, name, kind):
    p = tmp_path / name
    p.write_bytes(b"x")
    assert detect(p).name == kind


def test_detect_saved_model_dir_and_refusals(tmp_path):
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"")
    assert detect(tmp_path / "sm").name == "savedmodel"
    with pytest.raises(ConversionError, match="not a model modelpress can convert"):
        detect(tmp_path)  # a folder without saved_model.pb
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(ConversionError, match="already an ONNX model"):
        detect(tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match="no such file"):
        detect(tmp_path / "missing.pt2")
    with pytest.raises(ConversionError, match="not a model modelpress can convert"):
        detect(42)


def test_missing_extra_names_it(tmp_path, monkeypatch):
    p = tmp_path / "m.tflite"
    p.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    with pytest.raises(MissingExtraError, match=r"modelpress\[tensorflow\]"):
        convert(p)
