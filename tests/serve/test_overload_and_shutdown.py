"""Back-pressure, graceful shutdown and the bearer key, on a server in its own process.

A slow model (tens of milliseconds a run, one request a run) keeps requests waiting; the tests
watch the server's own gauges (/metrics) to know when requests are inside it, never the clock.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
from serve_testing import ServerProcess, cnn, slow
from tritonclient.utils import InferenceServerException

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    return slow(tmp_path_factory.mktemp("slow") / "slow.onnx")


def _input(x):
    i = th.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


SHAPE = (1, 256, 512)


def _binary_request(x: np.ndarray) -> tuple[bytes, bytes]:
    """A v2 request with one binary FP32 input ``x``: (HTTP head, body)."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    body = header + x.tobytes()
    head = (
        "POST /v2/models/slow/infer HTTP/1.1\r\nHost: test\r\n"
        f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {len(header)}\r\n\r\n"
    ).encode()
    return head, body


def test_queue_overflow_gives_503_with_retry_after_and_drops_nothing_accepted(slow_model):
    srv = ServerProcess([str(slow_model), "--max-batch", "1", "--max-queue", "2"])
    try:
        client = th.InferenceServerClient(srv.url, concurrency=8, network_timeout=120)
        xs = [np.full(SHAPE, i / 16, np.float32) for i in range(8)]
        jobs = [client.async_infer("slow", [_input(x)]) for x in xs]
        sess = ort.InferenceSession(str(slow_model))
        ok = refused = 0
        for x, job in zip(xs, jobs):
            try:
                got = job.get_result().as_numpy("y")
            except InferenceServerException as exc:
                assert exc.status() == "503" and "--max-queue 2" in exc.message()
                refused += 1
                continue
            np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=RTOL, atol=ATOL)
            ok += 1
        assert ok + refused == 8 and refused > 0 and ok >= 3  # one running and two waiting at least

        # the same burst from a plain client, which sees the headers
        def plain(x):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            head, body = _binary_request(x)
            conn.request(
                "POST",
                "/v2/models/slow/infer",
                body=body,
                headers={"Inference-Header-Content-Length": str(len(body) - x.nbytes)},
            )
            r = conn.getresponse()
            return r.status, r.getheader("Retry-After"), r.read()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(plain, xs))
        for x, (status, retry_after, body) in zip(xs, answers):
            if status == 503:
                assert retry_after == "1" and "--max-queue 2" in json.loads(body)["error"]
                refused += 1
            else:
                assert status == 200
                got = json.loads(body)["outputs"][0]
                np.testing.assert_allclose(
                    np.array(got["data"], np.float32).reshape(got["shape"]),
                    sess.run(None, {"x": x})[0],
                    rtol=RTOL,
                    atol=ATOL,
                )
                ok += 1
        assert srv.metric('modelpress_request_failures_total{code="503"') == refused
        assert srv.metric("modelpress_inferences_total") == ok  # every accepted request ran once
        # and once the burst is over, the server takes requests again
        np.testing.assert_allclose(
            client.infer("slow", [_input(xs[1])]).as_numpy("y"),
            sess.run(None, {"x": xs[1]})[0],
            rtol=RTOL,
            atol=ATOL,
        )
    finally:
        assert srv.stop() == 0


def test_sigterm_answers_every_accepted_request_then_exits_0(slow_model, tmp_path):
    record = tmp_path / "serve.json"
    srv = ServerProcess(
        [str(slow_model), "--max-batch", "1", "--max-queue", "64", "--json", str(record)]
    )
    client = th.InferenceServerClient(srv.url, concurrency=16, network_timeout=120)
    # a request whose body is still arriving when the signal comes
    x9 = np.full(SHAPE, 0.05, np.float32)
    head, body = _binary_request(x9)
    raw = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    raw.sendall(head + body[:1000])
    xs = [np.full(SHAPE, (i + 1) / 20, np.float32) for i in range(16)]
    jobs = [client.async_infer("slow", [_input(x)]) for x in xs]
    # all 17 inside the server, and some besides the half-sent one still waiting or running
    try:
        _wait_for(
            lambda: (
                srv.metric("modelpress_requests_total") == 17
                and srv.metric("modelpress_requests_in_progress") >= 3
            ),
            "requests inside the server",
        )
    except BaseException:
        srv.proc.kill()  # no server left behind by a failed test
        raise
    srv.terminate()
    time.sleep(0.3)  # the server is draining: its listening socket is closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    raw.sendall(body[1000:])
    response = b""
    while chunk := raw.recv(65536):  # the server closes the connection after answering
        response += chunk
    raw.close()
    assert response.startswith(b"HTTP/1.1 200")
    sess = ort.InferenceSession(str(slow_model))
    answer = json.loads(response.split(b"\r\n\r\n", 1)[1])["outputs"][0]
    np.testing.assert_allclose(
        np.array(answer["data"], np.float32).reshape(answer["shape"]),
        sess.run(None, {"x": x9})[0],
        rtol=RTOL,
        atol=ATOL,
    )
    for x, job in zip(xs, jobs):
        np.testing.assert_allclose(
            job.get_result().as_numpy("y"), sess.run(None, {"x": x})[0], rtol=RTOL, atol=ATOL
        )
    assert srv.proc.wait(timeout=60) == 0
    assert "every accepted request was answered" in srv.proc.stdout.read()
    (served,) = json.loads(record.read_text())["result"]["models"]
    assert served["requests"] == served["rows"] == served["runs"] == 17 and served["failures"] == {}


def test_api_key_guards_everything_but_health(tmp_path):
    key = tmp_path / "key.txt"
    key.write_text("s3cret-token\n")
    srv = ServerProcess([str(cnn(tmp_path / "cnn.onnx")), "--api-key-file", str(key)])
    try:
        client = th.InferenceServerClient(srv.url)
        assert client.is_server_live() and client.is_server_ready()  # open
        x = np.ones((1, 3, 8, 8), np.float32)
        for headers in (
            None,
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Basic s3cret-token"},
        ):
            with pytest.raises(InferenceServerException) as info:
                client.infer("cnn", [_input(x)], headers=headers)
            assert info.value.status() == "401"
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata("cnn", headers=headers)
            assert info.value.status() == "401"
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        r.read()
        assert r.status == 401 and r.getheader("WWW-Authenticate") == "Bearer"
        good = {"Authorization": "Bearer s3cret-token"}
        result = client.infer("cnn", [_input(x)], headers=good)
        expected = ort.InferenceSession(str(tmp_path / "cnn.onnx")).run(None, {"x": x})[0]
        np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=RTOL, atol=ATOL)
    finally:
        assert srv.stop() == 0
