"""``modelpress quantize``: help, an end-to-end run, the JSON report, atomic output."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from quant_models import mlp, small_cnn

from modelpress.cli.main import main
from modelpress.ir import save
from modelpress.report.record import SCHEMA


def test_help_lists_modes_and_methods(capsys):
    try:
        main(["quantize", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for word in (
        "static",
        "dynamic",
        "weight-only",
        "fp16",
        "entropy",
        "percentile",
        "--max-accuracy-drop",
    ):
        assert word in out


def test_static_end_to_end_with_budget_and_report(tmp_path, capsys, rng):
    save(small_cnn(), tmp_path / "m.onnx")
    x = rng.standard_normal((48, 4, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x, label=np.zeros(48, np.int64))
    out, rep = tmp_path / "q.onnx", tmp_path / "r.json"
    code = main(
        [
            "quantize",
            str(tmp_path / "m.onnx"),
            "-o",
            str(out),
            "--calib",
            str(tmp_path / "c.npz"),
            "--method",
            "percentile",
            "--labels-key",
            "label",
            "--max-accuracy-drop",
            "1",
            "--json",
            str(rep),
            "--keep-anyway",  # a model this small may run slower in int8 on some CPUs
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and out.exists()
    onnx.checker.check_model(str(out), full_check=True)
    assert "output error vs float model" in text and "within budget" in text
    record = json.loads(rep.read_text())
    assert record["command"] == "quantize" and record["schema"] == SCHEMA
    data = record["result"]
    assert data["mode"] == "static" and data["method"] == "percentile"
    assert data["written"] == str(out)
    assert all(f.startswith("static int8 runs slower") for f in data["check"]["failures"])
    assert data["check"]["deployed_error"] < 0.05 and data["check"]["reference_error"] < 0.05
    assert any(layer["quantized"] for layer in data["layers"])
    # both models were timed on the calibration batch; the ratio is theirs
    lat = data["check"]["latency"]
    assert "latency here (ONNX Runtime)" in text
    assert lat["float"]["runs"] >= 5 and lat["quantized"]["runs"] == lat["float"]["runs"]
    assert lat["ratio"] == lat["quantized"]["median_ms"] / lat["float"]["median_ms"]


def test_weight_only_int4_cli_and_bad_option(tmp_path, capsys):
    save(mlp(), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    assert (
        main(
            [
                "quantize",
                str(tmp_path / "m.onnx"),
                "-o",
                str(out),
                "--mode",
                "weight-only",
                "--bits",
                "4",
                "--block-size",
                "16",
            ]
        )
        == 0
    )
    assert "upgraded opset 17 → 21" in capsys.readouterr().out
    bad = tmp_path / "bad.onnx"
    code = main(
        [
            "quantize",
            str(tmp_path / "m.onnx"),
            "-o",
            str(bad),
            "--mode",
            "weight-only",
            "--bits",
            "4",
            "--block-size",
            "24",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and not bad.exists() and err.startswith("error: --block-size 24")


def test_no_smooth_turns_outlier_smoothing_off(tmp_path, capsys, rng):
    from quant_models import transformer_ffn

    save(transformer_ffn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((16, 8, 32)).astype(np.float32))
    base = [
        "quantize",
        str(tmp_path / "m.onnx"),
        "--mode",
        "static",
        "--calib",
        str(tmp_path / "c.npz"),
    ]
    assert main([*base, "-o", str(tmp_path / "a.onnx"), "--no-latency"]) == 0
    assert "smoothing" in capsys.readouterr().out
    assert main([*base, "-o", str(tmp_path / "b.onnx"), "--no-latency", "--no-smooth"]) == 0
    out = capsys.readouterr().out
    assert "smoothing" not in out and "latency on this CPU" not in out


def test_top_ops_names_the_kernels_of_the_quantized_model(tmp_path, rng):
    """The breakdown printed when int8 is not faster: ONNX Runtime's int8 kernels by share of
    time, and no profiler trace left behind."""
    import glob
    import os
    import tempfile

    from modelpress.compress import quantize
    from modelpress.runtime.measure import top_ops

    calib = [{"x": rng.standard_normal((8, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    q = quantize(small_cnn(), mode="static", data=calib, optimize=False).model
    top = top_ops(q, calib[0])
    shares = {op: int(pct.rstrip("%")) for op, pct in (item.split() for item in top.split(", "))}
    assert "QLinearConv" in shares and all(0 <= v <= 100 for v in shares.values())
    assert not glob.glob(os.path.join(tempfile.gettempdir(), "modelpress_profile*"))


def test_a_missing_output_directory_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib

    q = importlib.import_module("modelpress.compress.quantize")
    passes = importlib.import_module("modelpress.passes")

    save(small_cnn(), tmp_path / "m.onnx")
    for command, module, name in (("quantize", q, "quantize"), ("optimize", passes, "optimize")):
        monkeypatch.setattr(module, name, lambda *a, c=command, **k: pytest.fail(f"{c} ran"))
        out = tmp_path / "nope" / "q.onnx"
        args = [command, str(tmp_path / "m.onnx"), "-o", str(out)]
        code = main(args + (["--mode", "weight-only"] if command == "quantize" else []))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and not out.parent.exists()
        assert len(err) == 1 and "output directory" in err[0] and "does not exist" in err[0]


def test_a_result_with_nan_outputs_is_not_written(tmp_path, capsys, monkeypatch):
    """However a NaN got in (a 16-bit overflow, a corrupt scale), the CLI refuses the file."""
    import importlib

    import onnx_ir as ir

    weight_only = importlib.import_module("modelpress.compress.quantize.weight_only")
    real = weight_only.apply

    def corrupt(*args, **kwargs):
        m, done, notes = real(*args, **kwargs)
        v = next(v for v in m.graph.initializers.values() if v.name.endswith("_scale"))
        v.const_value = ir.tensor(np.full(v.const_value.shape, np.nan, np.float32), name=v.name)
        return m, done, notes

    monkeypatch.setattr(weight_only, "apply", corrupt)
    save(mlp(), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    code = main(["quantize", str(tmp_path / "m.onnx"), "-o", str(out), "--mode", "weight-only"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out.exists()
    assert len(err) == 1 and "NaN" in err[0] and "not written" in err[0]
