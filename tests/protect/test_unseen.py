"""Models the project never built, as packages ship them (the pinned ``corpus`` extra): protected
with and without obfuscation through the CLI, they run through ``modelpress run --key-file`` with
the original's outputs, and the obfuscated file names nothing of theirs.

Chosen for what they bring: ai.onnx.ml ops and an int32 input (magika); If subgraphs, an LSTM and a
scalar input (silero-vad); ONNX Runtime's own quantized ops in com.microsoft at IR 6 (ddddocr);
opset 11 at IR 7 (PaddleOCR's classifier)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from modelpress.cli.main import main
from modelpress.ir import load
from modelpress.verify import run_model

pytestmark = pytest.mark.corpus

UNSEEN = {
    "magika": ("magika", "models/standard_v3_3/model.onnx", {"bytes": ((2, 2048), np.int32)}),
    "silero-vad": (
        "silero_vad",
        "data/silero_vad.onnx",
        {"input": ((1, 512), np.float32), "state": ((2, 1, 128), np.float32), "sr": ((), np.int64)},
    ),
    "ddddocr-old": ("ddddocr", "common_old.onnx", {"input1": ((1, 1, 64, 96), np.float32)}),
    "paddle-cls": (
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": ((1, 3, 48, 192), np.float32)},
    ),
}


def _path(name: str) -> Path:
    package, rel, _ = UNSEEN[name]
    spec = importlib.util.find_spec(package)  # the package's files, without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            f"the corpus package {package!r} is missing: `make test` installs the `corpus` extra"
        )
    return Path(list(spec.submodule_search_locations)[0]) / rel


def _feeds(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for k, (shape, dtype) in UNSEEN[name][2].items():
        if k == "sr":
            feeds[k] = np.array(16000, dtype=dtype)  # a sample rate the model accepts
        elif k == "state":
            feeds[k] = np.zeros(shape, dtype=dtype)
        elif dtype == np.int32:
            feeds[k] = rng.integers(0, 256, shape).astype(dtype)
        else:
            feeds[k] = (rng.standard_normal(shape) * 0.5).astype(dtype)
    return feeds


@pytest.mark.parametrize("name", list(UNSEEN))
def test_unseen_models_run_protected_with_the_originals_outputs(name, tmp_path, capsys):
    source = _path(name)
    feeds = _feeds(name)
    want = run_model(load(source), feeds)
    np.savez(tmp_path / "in.npz", **feeds)
    key = tmp_path / "key.bin"
    assert main(["keygen", "-o", str(key)]) == 0
    for label, extra in (
        ("plain", []),
        ("obfuscated", ["--obfuscate", "--json", str(tmp_path / "rec.json")]),
    ):
        package = tmp_path / f"{label}.mpk"
        check = ["--data", str(tmp_path / "in.npz")]  # silero-vad runs only at a real sample rate
        assert (
            main(
                ["protect", str(source), "-o", str(package), "--key-file", str(key), *check, *extra]
            )
            == 0
        )
        out = tmp_path / f"{label}.npz"
        assert (
            main(
                [
                    "run",
                    str(package),
                    str(tmp_path / "in.npz"),
                    "-o",
                    str(out),
                    "--key-file",
                    str(key),
                ]
            )
            == 0
        )
        got = np.load(out)
        for k, w in want.items():
            scale = max(float(np.abs(w).max()), 1e-6) if w.size else 1.0
            assert got[k].dtype == w.dtype and got[k].shape == w.shape
            assert float(np.abs(got[k].astype(np.float64) - w).max(initial=0.0)) <= 1e-5 * scale, (
                label,
                k,
            )
    import json

    metrics = json.loads((tmp_path / "rec.json").read_text())["result"]["metrics"]
    assert metrics["anonymous_share"] == 1.0 and metrics["names_found"] == []
    assert metrics["max_weight_correlation"] < 0.05
    capsys.readouterr()
