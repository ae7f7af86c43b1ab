"""`modelpress serve` opens protected models with the key options, like every command: a runtime-
mode package answers Open Inference Protocol requests with the original's outputs, and a wrong
key stops the server before it listens, with one error line."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
from serve_testing import ROOT, ServerProcess, cnn

from modelpress.protect import keygen, load_key, protect


def test_a_protected_model_is_served_with_the_originals_outputs(tmp_path):
    source = cnn(tmp_path / "cnn.onnx")
    key = keygen(tmp_path / "key.bin")
    package = tmp_path / "cnn.mpk"
    protect(source, key=load_key(key_file=key), output=package, obfuscate=True, ratio=0.6)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    server = ServerProcess([str(package), "--name", "cnn", "--key-file", str(key)])
    try:
        body = {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }
        request = urllib.request.Request(
            f"http://{server.url}/v2/models/cnn/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    finally:
        assert server.stop() == 0
    (out,) = answer["outputs"]
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_wrong_key_stops_the_server_with_one_line(tmp_path):
    source = cnn(tmp_path / "cnn.onnx")
    package = tmp_path / "cnn.mpk"
    protect(
        source, key=load_key(key_file=keygen(tmp_path / "key.bin")), output=package, verify=False
    )
    other = keygen(tmp_path / "other.bin")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelpress.cli.main",
            "serve",
            str(package),
            "--key-file",
            str(other),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "wrong key or the file was modified" in lines[0], done.stderr


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """Requests to 127.0.0.1 must not go through a proxy the environment may name."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
