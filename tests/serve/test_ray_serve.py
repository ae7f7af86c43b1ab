"""The same server on Ray Serve, on a local cluster this test starts (``ray.init(num_cpus=2)``),
and the one-line message when Ray is missing."""

from __future__ import annotations

import socket
import sys

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
from serve_testing import cnn
from tritonclient.utils import InferenceServerException

from modelpress.cli.main import main
from modelpress.ir import load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ray_serve_answers_tritonclient_like_the_local_server(tmp_path):
    import ray

    from modelpress.serve.options import ServeOptions
    from modelpress.serve.ray_serve import ModelSource, deploy

    path = cnn(tmp_path / "cnn.onnx")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        dep = deploy(
            [ModelSource("cnn", load(path))],
            ServeOptions(max_batch=8, max_delay_ms=5),
            host="127.0.0.1",
            port=_free_port(),
        )
        client = th.InferenceServerClient(dep.url, concurrency=8, network_timeout=120)
        assert client.get_model_metadata("cnn")["inputs"][0]["shape"] == [-1, 3, -1, -1]
        rng = np.random.default_rng(7)
        xs = [
            rng.standard_normal(s).astype(np.float32)
            for s in [(1, 3, 8, 8), (2, 3, 8, 8), (1, 3, 5, 5)] * 2
        ]
        jobs = []
        for x in xs:
            i = th.InferInput("x", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            jobs.append(client.async_infer("cnn", [i]))
        sess = ort.InferenceSession(str(path))
        for x, job in zip(xs, jobs):
            np.testing.assert_allclose(
                job.get_result().as_numpy("logits"),
                sess.run(None, {"x": x})[0],
                rtol=1e-5,
                atol=1e-6,
            )
        bad = th.InferInput("x", [1, 2, 8, 8], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 2, 8, 8), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("cnn", [bad])
        assert info.value.status() == "400" and "expects [-1, 3, -1, -1]" in info.value.message()
        dep.shutdown()
    finally:
        ray.shutdown()


def test_serve_ray_without_ray_names_the_extra(tmp_path, monkeypatch, capsys):
    path = cnn(tmp_path / "cnn.onnx")
    monkeypatch.setitem(
        sys.modules, "ray", None
    )  # an import of ray now fails, as when it is missing
    assert main(["serve", str(path), "--ray"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "error: serving on Ray (--ray) needs the 'ray' package: install it with `pip install 'modelpress[ray]'`"
    )
