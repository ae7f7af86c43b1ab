"""Planning with the server's own cost, the open-loop load, the check, and bad targets."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace

import numpy as np
import pytest
import yaml
from serve_testing import cnn

from modelpress.advisor.batching import analyse
from modelpress.advisor.curve import ServiceCurve
from modelpress.advisor.service import NoServiceError, plan_option, plan_service, with_server_time
from modelpress.cli.main import main
from modelpress.deploy import ServerCost, deploy
from modelpress.deploy.load import http_request, open_loop
from modelpress.deploy.overhead import answer_bytes, json_body
from modelpress.ir import load
from modelpress.profile.workload import workload_from_onnx

CURVE = ServiceCurve((1, 2, 4, 8), (0.001, 0.0015, 0.0024, 0.0042), 8, "a formula")
COST = ServerCost(
    per_request_ms=0.8,
    saturated_rps=900.0,
    per_kb_ms=0.02,
    tail_ms=3.0,
    samples=1,
    spread_ms=(0, 0),
)


def test_the_server_time_is_added_per_request_of_a_batch():
    c = 0.0007
    curve = with_server_time(CURVE, c)
    b = np.array([1, 2, 3, 4, 6, 8, 12])
    np.testing.assert_allclose(curve(b), CURVE(b) + b * c, rtol=1e-12)


def test_the_promise_is_the_queue_p99_plus_the_servers_spread():
    got = plan_option("cpu", "cpu", CURVE, qps=300, p99_ms=20, rates=(None, None), tail_ms=4.0)
    q = analyse(
        300 / got.replicas, CURVE, max_batch=got.max_batch, max_delay_s=got.max_delay_ms / 1e3
    )
    assert got.queue.p99_ms == pytest.approx(q.p99_ms + 4.0, rel=1e-12)
    assert got.queue.p99_ms <= 20
    # a spread as large as the target leaves nothing to plan with: the reason says so
    assert "varies by 25 ms" in plan_option(
        "cpu", "cpu", CURVE, qps=300, p99_ms=20, rates=(None, None), tail_ms=25.0
    )


def test_a_plan_with_the_server_cost_needs_more_than_one_without(tmp_path):
    model = load(cnn(tmp_path / "cnn.onnx"))
    workload = workload_from_onnx(model, name="cnn", shapes={"x": (1, 3, 8, 8)})
    from modelpress.advisor.service import Machine

    machine = Machine("cpu", CURVE)
    plain = plan_service(workload, [], qps=2000, p99_ms=30, precision="fp32", machine=machine)
    served = plan_service(
        workload, [], qps=2000, p99_ms=30, precision="fp32", machine=machine, server_s=0.001
    )
    assert served.options[0].replicas > plain.options[0].replicas


def test_request_bodies_are_what_the_server_reads_and_writes():
    from modelpress.serve.protocol import decode_request, encode_response

    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4) / 7
    body = json_body({"x": x})
    req = decode_request(body)
    np.testing.assert_array_equal(req.inputs["x"], x)
    answer, _ = encode_response({"y": x}, model_name="m", request=req)
    assert answer_bytes({"y": x}, "m") == len(answer)


class _Stub:
    """An HTTP/1.1 server on a thread answering 200, except every third request: 503."""

    def __init__(self):
        self.count = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    async def _client(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.count += 1
                status = b"503 Busy" if self.count % 3 == 0 else b"200 OK"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_open_loop_counts_every_request_it_sends():
    stub = _Stub()
    try:
        r = open_loop(
            "127.0.0.1",
            stub.port,
            http_request("/x", b"{}"),
            rate=400,
            max_requests=150,
            max_seconds=5,
            warmup_s=0.1,
        )
    finally:
        stub.stop()
    # the arrivals are a seeded Poisson stream: the requests after the warm-up, at most 150
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 400, size=int(400 * 5.1 * 1.2) + 16))
    warm = int(np.searchsorted(arrivals, 0.1))
    assert r.sent == min(150, int((arrivals < 5.1).sum()) - warm)
    assert r.answered + r.failed == r.sent
    total = stub.count  # warm-up requests included: every third of all of them was refused
    assert r.failed in (sum(1 for i in range(total - r.sent + 1, total + 1) if i % 3 == 0),)
    assert r.p99_ms == float("inf")  # a third failed: the tail is past every answer
    assert json.dumps(r.to_dict())  # no infinity in what records hold


def test_bad_targets_are_one_line_saying_what_is_possible(tmp_path, capsys):
    path = cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "deploy"
    assert main(["deploy", str(path), "-o", str(out), "--qps", "0", "--p99-ms", "50"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --qps") and "above 0" in err and len(err.splitlines()) == 1
    assert (
        main(
            [
                "deploy",
                str(path),
                "-o",
                str(out),
                "--qps",
                "10",
                "--p99-ms",
                "50",
                "--gpu",
                "H1000X",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gpu") and len(err.splitlines()) == 1
    assert (
        main(
            [
                "deploy",
                str(path),
                "-o",
                str(out),
                "--qps",
                "10",
                "--p99-ms",
                "50",
                "--device",
                "tpu",
            ]
        )
        == 1
    )
    assert "cpu or cuda" in capsys.readouterr().err
    # p99 below what the model and the server take: the lowest reachable, in one line
    with pytest.raises(
        NoServiceError, match=r"below what this machine can answer in.*ask `p99_ms`"
    ):
        deploy(path, out, qps=10, p99_ms=0.01, cost=COST, check=False)
    assert not out.exists()  # nothing written


@pytest.mark.slow
def test_deploy_writes_the_folder_and_checks_the_plan(tmp_path):
    path = cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "deploy"
    r = deploy(path, out, qps=50, p99_ms=200, cost=COST, check_requests=100, check_seconds=3)
    assert [c.status for c in r.checks] == ["ok"] * 5
    settings = yaml.safe_load((out / "serve.yaml").read_text())
    o = r.chosen
    assert (settings["max_batch"], settings["replicas"]) == (o.max_batch, o.replicas)
    assert settings["plan"]["promised_p99_ms"] == pytest.approx(o.queue.p99_ms, abs=1e-3)
    # the check served this machine's option and measured it; the verdict follows the ratio
    c = r.check
    assert c is not None and c.load.sent == c.load.answered + c.load.failed > 0
    assert c.missed == (c.load.p99_ms > 1.25 * c.promised_p99_ms)
    assert c.promised_p99_ms == o.queue.p99_ms
    d = json.loads(json.dumps(r.to_dict()))
    assert d["check"]["rate"] == pytest.approx(50 / o.replicas)
    # deploying again replaces the folder (it is a deploy folder)
    r2 = deploy(path, out, qps=50, p99_ms=200, cost=replace(COST, tail_ms=0.0), check=False)
    assert r2.check is None and (out / "serve.yaml").is_file()


def test_labelled_data_is_split_between_training_and_scoring(tmp_path):
    # deploy's search splits labelled data itself (``search.split``, tested in tests/search)
    from modelpress.ir.feeds import load_npz
    from modelpress.ir.files import write_npz
    from modelpress.search.space import build_space
    from modelpress.search.split import holdout_split, write_parts

    n = 200
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    write_npz(tmp_path / "d.npz", {"x": x, "y": np.arange(n) % 10})
    split = holdout_split(np.arange(n) % 10)
    score, train = write_parts(load_npz(tmp_path / "d.npz"), split, tmp_path / "c")
    # with training data the space holds pruning, QAT and distillation candidates
    space = build_space(
        gpu=False,
        quantize_options={"calibration": score},
        train_options={"data": train, "labels_key": "y"},
    )
    kinds = {s.kind for c in space.candidates() for s in c.steps}
    assert {"prune", "distill"} <= kinds and "qat" in space.modes
    (distill,) = [c for c in space.candidates() if c.step("distill")]
    assert distill.step("distill").opts == {
        "data": train,
        "labels_key": "y",
        "width": 0.5,
        "min_train_steps": 300,
    }
    assert "distill(width=0.5)" in distill.label()


@pytest.mark.slow
def test_a_protected_deploy_serves_its_package(tmp_path):
    from modelpress.protect import keygen, load_key, open_package

    path = cnn(tmp_path / "cnn.onnx")
    key = keygen(tmp_path / "key.bin")
    out = tmp_path / "deploy"
    r = deploy(path, out, qps=20, p99_ms=500, cost=COST, key_file=key, check_seconds=2)
    assert r.settings.protected and (out / "model.mpk").is_file()
    assert not (out / "model.onnx").exists() and not (out / "triton").exists()
    assert [c.file for c in r.checks] == [
        "serve.yaml",
        "ray-serve.yaml",
        "kserve.yaml",
        "Dockerfile",
    ]
    # the package opens with the key into the model deployed; the check served it
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 4)).astype(np.float32)
    import onnxruntime as ort

    from modelpress.ir import model_bytes

    opened = ort.InferenceSession(model_bytes(open_package(out / "model.mpk", load_key(key))))
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(opened.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    assert r.check is not None and r.check.load.answered > 0
    kserve = yaml.safe_load((out / "kserve.yaml").read_text())
    env = kserve["spec"]["predictor"]["containers"][0]["env"]
    assert env[0]["name"] == "MODELPRESS_KEY"
    assert '"--key-env", "MODELPRESS_KEY"' in (out / "Dockerfile").read_text()
