"""`modelpress demo` runs end to end: convert, optimize, verify, time, score, summarize."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    # A subprocess: the demo switches ONNX Runtime to one global thread pool for its timings,
    # which must not leak into the other tests' sessions.
    proc = subprocess.run(
        [sys.executable, "-m", "modelpress.cli.main", "demo", "--out", str(out), "--runs", "20"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    for step in (
        "convert PyTorch → ONNX, verified",
        "optimize (level 2) and verify",
        "quantize to int8",
        "before / after",
        "protect: obfuscate and encrypt the int8 model",
        "what serves 2,000 requests/s at a 5 ms p99",
        "a transformer: optimize and dynamic int8",
        "a decoder LLM: convert with its KV cache, int4, generate, serve",
    ):
        assert step in text
    summary = json.loads((out / "summary.json").read_text())
    models = summary["models"]
    assert set(models) == {"original", "optimized", "int8"}
    assert models["original"]["verified"] and models["optimized"]["verified"]
    # the optimizer must not change what the model predicts on the test split (450 images)
    assert models["optimized"]["accuracy"] == pytest.approx(
        models["original"]["accuracy"], abs=1 / 450
    )
    assert models["original"]["accuracy"] > 0.9
    # int8 keeps the accuracy within half a point on the digits test split
    assert models["int8"]["accuracy"] >= models["original"]["accuracy"] - 0.005
    assert (out / "model.int8.onnx").stat().st_size < 0.5 * (out / "model.opt.onnx").stat().st_size
    assert (out / "model.onnx").is_file() and (out / "model.opt.onnx").is_file()
    # the protected package runs with the int8 model's outputs and hides its names and op types
    protected = summary["protect"]
    assert protected["max_rel"] <= 1e-5 and Path(protected["path"]).is_file()
    assert (
        protected["metrics"]["anonymous_share"] == 1.0 and protected["metrics"]["names_found"] == []
    )
    assert protected["metrics"]["max_weight_correlation"] < 0.05
    # the service plan: every option meets the tail latency with a batch a server would form
    service = summary["service"]
    assert service["qps"] == 2000 and service["options"]
    for option in service["options"]:
        assert (
            option["p99_ms"] <= 5.0 and 1 <= option["max_batch"] <= 256 and option["replicas"] >= 1
        )
    # the transformer step: dynamic int8 close to float32 on padded sentences, and smaller
    tr = summary["transformer"]
    assert tr["cosine"] > 0.99 and tr["size_ratio"] < 0.5
    assert set(tr["latency_ms"]) == {"float32", "optimized", "int8"}
    # the decoder: verified against transformers, int4 smaller, one real chat answer from the server
    dec = summary["decoder"]
    assert dec["max_logit_diff"] < 1e-3 and dec["int4_bytes"] < 0.5 * dec["float_bytes"]
    assert isinstance(dec["chat_answer"], str) and dec["chat_answer"]

    from modelpress.ir import graph_stats, load

    before = graph_stats(load(out / "model.onnx")).node_count
    after = graph_stats(load(out / "model.opt.onnx")).node_count
    assert after < before
    assert "BatchNormalization" not in graph_stats(load(out / "model.opt.onnx")).op_counts
