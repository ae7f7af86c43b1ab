"""The deploy folder: each file loads in the tool that reads it (Ray's schema, Triton's
ModelConfig protobuf, the InferenceService fields), with the plan's numbers in it; broken files
fail those tools; ``modelpress serve DEPLOY_DIR`` and Ray's own ``serve run`` answer tritonclient
like ONNX Runtime does."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
import yaml
from google.protobuf import text_format
from ray.serve.schema import ServeDeploySchema
from serve_testing import ROOT, ServerProcess, cnn, nonzero
from tritonclient.grpc import model_config_pb2

from modelpress.deploy.bundle import staged, write_bundle
from modelpress.deploy.settings import ServeSettings, read_folder
from modelpress.deploy.validate import check_kserve, check_ray, check_triton
from modelpress.errors import InputError, OptionError
from modelpress.ir import load

PLAN = {"qps": 300.0, "p99_ms": 50.0, "mean_ms": 8.0, "fewest_replicas": 2}


def _settings(**kw) -> ServeSettings:
    base = dict(
        model="model.onnx",
        name="cnn",
        max_batch=8,
        max_delay_ms=1.5,
        max_queue=40,
        replicas=3,
        plan=PLAN,
    )
    return ServeSettings(**{**base, **kw})


def _bundle(tmp_path: Path, model_path: Path, settings: ServeSettings) -> Path:
    out = tmp_path / "deploy"
    with staged(out) as folder:
        checks = write_bundle(
            folder, model=load(model_path), settings=settings, final=out, recipe=None
        )
    assert all(c.status == "ok" for c in checks), checks
    return out


def test_files_load_in_their_tools_with_the_plan_in_them(tmp_path):
    out = _bundle(tmp_path, cnn(tmp_path / "cnn.onnx"), _settings())
    # Triton: the protobuf Triton reads, parsed from its text format
    config = text_format.Parse(
        (out / "triton/cnn/config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.name == "cnn" and config.backend == "onnxruntime"
    assert config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 1500
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 40
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("x", model_config_pb2.TYPE_FP32, [3, -1, -1])
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [5])]
    assert (out / "triton/cnn/1/model.onnx").read_bytes() == (out / "model.onnx").read_bytes()
    # Ray: Ray's own schema of `serve run` / `serve deploy` configs
    schema = ServeDeploySchema.model_validate(yaml.safe_load((out / "ray-serve.yaml").read_text()))
    (app,) = schema.applications
    assert app.import_path == "modelpress.deploy.ray_app:build"
    assert app.args == {"folder": str(out.resolve())}
    (dep,) = app.deployments
    auto = dep.autoscaling_config
    # bounds from the plan: the fewest that carry the rate, the plan, twice the plan; Little's law
    assert (auto["min_replicas"], auto["initial_replicas"], auto["max_replicas"]) == (2, 3, 6)
    assert auto["target_ongoing_requests"] == int(np.ceil(300.0 / 3 * 8.0 / 1e3))
    assert dep.max_ongoing_requests == 40 + 8
    # KServe: the manifest's fields and types
    isvc = yaml.safe_load((out / "kserve.yaml").read_text())
    pred = isvc["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"], pred["scaleMetric"]) == (2, 6, "concurrency")
    assert check_kserve(out / "kserve.yaml").status == "ok"
    # serve.yaml round-trips
    settings, model = read_folder(out)
    assert settings == _settings() and model == out / "model.onnx"


def test_a_model_that_does_not_batch_gets_no_dynamic_batching(tmp_path):
    out = _bundle(tmp_path, nonzero(tmp_path / "nz.onnx"), _settings(name="nz"))
    config = text_format.Parse(
        (out / "triton/nz/config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, 4]


def test_broken_files_fail_in_their_tools(tmp_path):
    out = _bundle(tmp_path, cnn(tmp_path / "cnn.onnx"), _settings())
    pbtxt = out / "triton/cnn/config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace("max_batch_size", "max_batch"))
    assert check_triton(pbtxt).status == "failed"
    pbtxt.write_text("name: 'cnn'\ninstance_group [ { kind: KIND_TPU } ]\n")
    assert check_triton(pbtxt).status == "failed"
    ray = out / "ray-serve.yaml"
    data = yaml.safe_load(ray.read_text())
    data["applications"][0]["deployments"][0]["autoscaling_config"]["min_replicas"] = "two"
    ray.write_text(yaml.safe_dump(data))
    assert check_ray(ray).status == "failed"
    kserve = out / "kserve.yaml"
    good = yaml.safe_load(kserve.read_text())
    for path, value in (
        (("spec", "predictor", "minReplicas"), "1"),
        (("spec", "predictor", "scaleMetric"), "latency"),
        (("metadata", "name"), "Not_A_DNS_Name"),
        (("spec", "predictor", "replicas"), 3),
        (("kind",), "Deployment"),
    ):
        bad = yaml.safe_load(yaml.safe_dump(good))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        kserve.write_text(yaml.safe_dump(bad))
        assert check_kserve(kserve).status == "failed", path


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d.pop("max_batch"), "field 'max_batch' is missing"),
        (lambda d: d.update(max_queue="many"), "field 'max_queue' has the wrong type"),
        (lambda d: d.update(max_batch=0), "'max_batch' must be at least 1"),
        (lambda d: d.update(model="../cnn.onnx"), "field 'model'"),
        (lambda d: d.update(colour="blue"), "unknown field 'colour'"),
    ],
)
def test_a_wrong_serve_yaml_is_one_line_naming_the_field(tmp_path, edit, words):
    out = _bundle(tmp_path, cnn(tmp_path / "cnn.onnx"), _settings())
    data = yaml.safe_load((out / "serve.yaml").read_text())
    edit(data)
    (out / "serve.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=words):
        read_folder(out)


def test_a_folder_that_is_not_a_deploy_folder_is_not_replaced(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(OptionError, match="not a deploy folder"):
        with staged(out):
            pass
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def _infer(url: str, name: str, x: np.ndarray) -> np.ndarray:
    client = th.InferenceServerClient(url, network_timeout=120)
    i = th.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(name, [i]).as_numpy("logits")


def test_modelpress_serve_reads_the_folder(tmp_path):
    path = cnn(tmp_path / "cnn.onnx")
    out = _bundle(tmp_path, path, _settings(max_batch=4))
    server = ServerProcess([str(out)])
    try:
        client = th.InferenceServerClient(server.url)
        config = client.get_model_config("cnn")
        assert config["max_batch_size"] == 4  # the folder's setting, not the default 32
        x = np.random.default_rng(3).standard_normal((2, 3, 6, 6)).astype(np.float32)
        want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
        np.testing.assert_allclose(_infer(server.url, "cnn", x), want, rtol=1e-5, atol=1e-6)
    finally:
        assert server.stop() == 0


def test_modelpress_serve_refuses_a_protected_folder_without_its_key(tmp_path, capsys):
    from modelpress.cli.main import main

    out = _bundle(tmp_path, cnn(tmp_path / "cnn.onnx"), _settings())
    data = yaml.safe_load((out / "serve.yaml").read_text())
    data["protected"] = True
    (out / "serve.yaml").write_text(yaml.safe_dump(data))
    assert main(["serve", str(out)]) == 1
    assert "protected" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_rays_own_serve_run_runs_the_config(tmp_path):
    path = cnn(tmp_path / "cnn.onnx")
    out = _bundle(tmp_path, path, _settings(replicas=1, plan={**PLAN, "fewest_replicas": 1}))
    port = _free_port()
    config = yaml.safe_load((out / "ray-serve.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": port}  # a free port for the test
    ServeDeploySchema.model_validate(config)
    (tmp_path / "ray.yaml").write_text(yaml.safe_dump(config))
    serve_cli = Path(sys.executable).with_name("serve")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), RAY_DISABLE_DASHBOARD="1")
    proc = subprocess.Popen(
        [str(serve_cli), "run", str(tmp_path / "ray.yaml")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "serve run exited"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "serve run did not answer in 180 s"
                time.sleep(1)
        x = np.random.default_rng(4).standard_normal((3, 3, 5, 5)).astype(np.float32)
        want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
        got = _infer(f"127.0.0.1:{port}", "cnn", x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # serve run's own group: it shuts Ray down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp_path / "deploy", ignore_errors=True)
