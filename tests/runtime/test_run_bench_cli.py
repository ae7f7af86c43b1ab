"""`modelpress run` and `modelpress bench` from the command line."""

from __future__ import annotations

import numpy as np
from mp_testing import model_from_text

from modelpress.cli.main import main
from modelpress.ir import save

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3] x) => (float[N, 2] y) <float[3, 2] w = {1, 2, 3, 4, 5, 6}> {
  m = MatMul(x, w)
  y = Relu(m)
}
"""


def test_run_writes_outputs_under_their_names(tmp_path, capsys):
    model = save(model_from_text(TEXT), tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    w = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    assert (
        main(
            [
                "run",
                str(model),
                "--inputs",
                str(tmp_path / "in.npz"),
                "-o",
                str(tmp_path / "out.npz"),
                "--batch-size",
                "2",
                "--log-placement",
            ]
        )
        == 0
    )
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-5)
    assert "-> cpu" in capsys.readouterr().out


def test_run_bad_inputs_one_error_line_no_output(tmp_path, capsys):
    model = save(model_from_text(TEXT), tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 3), np.int32))
    code = main(
        ["run", str(model), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]
    )
    err = capsys.readouterr().err.strip()
    assert (
        code == 1 and err.startswith("error:") and "'x' has dtype int32" in err and "\n" not in err
    )
    assert not (tmp_path / "out.npz").exists()
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert (
        main(
            [
                "run",
                str(model),
                "--inputs",
                str(tmp_path / "bad.npz"),
                "-o",
                str(tmp_path / "out.npz"),
            ]
        )
        == 1
    )
    assert "not a readable .npz" in capsys.readouterr().err


def test_bench_compares_models_and_writes_json(tmp_path):
    import json

    model = save(model_from_text(TEXT), tmp_path / "m.onnx")
    code = main(
        [
            "bench",
            str(model),
            "--vs",
            str(model),
            "--runs",
            "3",
            "--warmup",
            "1",
            "--dim",
            "N=4",
            "--profile-ops",
            "--json",
            str(tmp_path / "b.json"),
        ]
    )
    assert code == 0
    record = json.loads((tmp_path / "b.json").read_text())
    assert record["command"] == "bench"
    data = record["result"]
    assert data["batch"] == 4 and len(data["models"]) == 2
    first = data["models"][0]
    assert first["flops"] == 2 * 4 * 3 * 2 + 4 * 2  # MatMul MACs×2 + Relu
    assert first["timing"]["p25_ms"] <= first["timing"]["median_ms"] <= first["timing"]["p75_ms"]
    assert data["machine_peak_gflops"] > 0
