"""Hostile clients against a real server: each attack is refused with a JSON error that the metrics
count, and a control client sent between and during the attacks gets the answer ONNX Runtime gives.

No timings are asserted (they go in benchmarks/bench_serve.py --attacks): the tests check what each
client gets. The server runs with short limits so that the deadlines pass within the test (but
not so short that a control client on a loaded machine misses them).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
from serve_testing import ServerProcess, cnn, slow

RTOL, ATOL = 1e-5, 1e-6
X = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return cnn(tmp_path_factory.mktemp("cnn") / "cnn.onnx")


@pytest.fixture(scope="module")
def server(model):
    srv = ServerProcess(
        [
            str(model),
            "--max-body-mb",
            "1",
            "--max-pending-mb",
            "2",
            "--max-request-rows",
            "16",
            "--header-timeout",
            "2",
            "--body-timeout",
            "3",
            "--max-connections",
            "40",
        ]
    )
    yield srv
    assert srv.stop() == 0


def _control(server, model) -> None:
    """One ordinary request; its answer must be ONNX Runtime's."""
    client = th.InferenceServerClient(server.url, network_timeout=60)
    x = th.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    got = client.infer("cnn", [x]).as_numpy("logits")
    want = ort.InferenceSession(str(model)).run(None, {"x": X})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def _exchange(port: int, raw: bytes, timeout: float = 30) -> tuple[int, dict, bytes]:
    """Send ``raw`` on a fresh connection; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


def _post(port: int, body: bytes, extra: bytes = b"", path: bytes = b"/v2/models/cnn/infer"):
    head = b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(body)
    return _exchange(port, head + extra + b"\r\n" + body)


def _v2(inputs: list[dict]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def _failures(server) -> float:
    return server.metric("modelpress_request_failures_total")


def test_declared_sizes_are_checked_against_the_body_before_allocating(server, model):
    before = _failures(server)
    header = _v2(
        [
            {
                "name": "s",
                "datatype": "BYTES",
                "shape": [200_000_000],
                "parameters": {"binary_data_size": 0},
            }
        ]
    )
    status, headers, body = _post(
        server.port, header, b"Inference-Header-Content-Length: %d\r\n" % len(header)
    )
    assert status == 400 and headers["content-type"] == "application/json"
    assert "needs at least 800000000 bytes" in json.loads(body)["error"]
    # JSON data shorter than its shape, a shape past any tensor, binary data of the wrong size
    cases = [
        _v2([{"name": "x", "datatype": "FP32", "shape": [10**9, 3, 8, 8], "data": [1.0]}]),
        _v2([{"name": "x", "datatype": "BYTES", "shape": [10**9], "data": ["a"]}]),
        _v2([{"name": "x", "datatype": "FP32", "shape": [2**40, 0], "data": []}]),
    ]
    for case in cases:
        status, headers, body = _post(server.port, case)
        assert status == 400 and "input 'x'" in json.loads(body)["error"]
    assert _failures(server) == before + 4
    _control(server, model)


def test_malformed_fields_are_json_400s_and_counted(server, model):
    before = _failures(server)
    x = {"name": "x", "shape": [1], "data": [1.0]}
    bad_bodies = [
        _v2([{**x, "datatype": ["FP32"]}]),
        _v2([{**x, "datatype": {"a": 1}}]),
        _v2([{**x, "datatype": "FP32", "shape": "[1]"}]),
        _v2([{**x, "datatype": "FP32", "data": {"a": 1}}]),
        json.dumps({"inputs": {"x": 1}}).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # deeper than any parser's recursion
        b'{"inputs": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}",
        b"\xff\xfe not UTF-8",
    ]
    for body in bad_bodies:
        status, headers, answer = _post(server.port, body)
        assert status == 400, body[:40]
        assert headers["content-type"] == "application/json"
        assert json.loads(answer)["error"]
    # header values that are not UTF-8 (nor numbers where numbers are due)
    for extra in (
        b"Inference-Header-Content-Length: \xff\xfe\r\n",
        b"Inference-Header-Content-Length: \xb2\r\n",  # a digit to str.isdigit, not to int()
        b"Content-Encoding: g\xffzip\r\n",
        b"Content-Type: image/\xff\xfe\r\n",
        b"Authorization: Bearer \xff\xfe\r\n",
    ):
        status, headers, answer = _post(server.port, _v2([{**x, "datatype": "FP32"}]), extra)
        assert 400 <= status < 500 and headers["content-type"] == "application/json"
        assert json.loads(answer)["error"]
    # a request line httptools cannot parse
    status, headers, answer = _exchange(server.port, b"POST /v2 \xff\xff HTTP/9\r\n\r\n")
    assert status == 400 and json.loads(answer)["error"]
    assert _failures(server) == before + len(bad_bodies) + 5 + 1
    _control(server, model)


def test_non_finite_values_follow_the_protocol_rule(server, model):
    # 1e39 does not fit FP32: refused naming the input, never rounded to infinity
    body = _v2([{"name": "x", "datatype": "FP32", "shape": [1, 3, 1, 1], "data": [0, 1e39, 0]}])
    status, _, answer = _post(server.port, body)
    error = json.loads(answer)["error"]
    assert status == 400 and "input 'x'" in error and "1e+39" in error and "FP32" in error
    # NaN and infinities travel as the strings "NaN", "Infinity", "-Infinity", in and out
    data = ["NaN", "Infinity", "-Infinity"] + [0.5] * (3 * 64 - 3)
    body = _v2([{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": data}])
    status, _, answer = _post(server.port, body)
    assert status == 200

    def strict(token):
        raise AssertionError(f"bare {token} in a JSON answer")

    out = json.loads(answer, parse_constant=strict)["outputs"][0]
    got = np.array(out["data"], np.float32)
    x = np.array([float(v) if isinstance(v, str) else v for v in data], np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x.reshape(1, 3, 8, 8)})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want.reshape(-1)))
    assert any(isinstance(v, str) for v in out["data"])
    # tritonclient reads them back as numbers
    client = th.InferenceServerClient(server.url)
    i = th.InferInput("x", [1, 3, 8, 8], "FP32")
    i.set_data_from_numpy(x.reshape(1, 3, 8, 8), binary_data=False)
    got = client.infer("cnn", [i], outputs=[th.InferRequestedOutput("logits", binary_data=False)])
    np.testing.assert_array_equal(np.isnan(got.as_numpy("logits")), np.isnan(want))


def test_requests_over_the_row_and_byte_caps_are_refused(server, model):
    x = np.zeros((17, 3, 8, 8), np.float32)
    client = th.InferenceServerClient(server.url)
    i = th.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    with pytest.raises(Exception) as info:
        client.infer("cnn", [i])
    assert info.value.status() == "413" and "--max-request-rows" in info.value.message()
    # two bodies of 0.9 MB arriving slowly hold 1.8 MB of --max-pending-mb 2: the next is 503
    header = _v2(
        [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 3, 256, 300],
                "parameters": {"binary_data_size": 3 * 256 * 300 * 4},
            }
        ]
    )
    size = len(header) + 3 * 256 * 300 * 4
    head = (
        b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n" % (size, len(header))
    )
    holders = []
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(head + header + b"\0" * 900_000)
        holders.append(s)
    deadline = time.monotonic() + 20
    while server.metric("modelpress_request_bytes_held") < 1_800_000:
        assert time.monotonic() < deadline, "the server did not read the two bodies"
        time.sleep(0.02)
    status, headers, answer = _post(server.port, header + b"\0" * (size - len(header)))
    assert status == 503 and "--max-pending-mb" in json.loads(answer)["error"]
    assert headers["retry-after"] == "1"
    for s in holders:  # their bodies never finish: 408 after --body-timeout
        s.settimeout(30)
        assert s.recv(65536).startswith(b"HTTP/1.1 408")
        s.close()
    assert server.metric("modelpress_request_bytes_held") == 0
    _control(server, model)


class _SlowClients:
    """``count`` connections that send a request a byte at a time, every ``gap`` seconds."""

    def __init__(self, port: int, count: int, gap: float = 0.05):
        self.port, self.count, self.gap = port, count, gap
        self.closed_by_server = 0
        self.answers: list[bytes] = []
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        # all connected before the control starts: the control then arrives at a full server
        # (in this process the two threads would otherwise race for the interpreter lock)
        self._connected.wait(60)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        request = b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
        socks = []
        for _ in range(self.count):
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                continue
            s.setblocking(False)
            socks.append([s, 0])
        self._connected.set()
        while socks and not self._stop.is_set():
            for entry in list(socks):
                s, sent = entry
                try:
                    data = s.recv(65536)
                    if data or data == b"":
                        self.answers.append(data)
                        self.closed_by_server += 1
                        socks.remove(entry)
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server += 1
                    socks.remove(entry)
                    s.close()
                    continue
                try:
                    s.send(request[sent : sent + 1] if sent < len(request) else b"0")
                    entry[1] = min(sent + 1, len(request))
                except OSError:
                    pass
            time.sleep(self.gap)
        for s, _ in socks:
            s.close()


def test_slow_clients_cannot_lock_out_a_control_client(server, model):
    before = server.metric('modelpress_request_failures_total{code="408"')
    # 200 connections, five times --max-connections, sending headers a byte at a time
    with _SlowClients(server.port, 200) as slow_clients:
        for _ in range(10):
            _control(server, model)
            time.sleep(0.1)
        deadline = time.monotonic() + 60
        while slow_clients.closed_by_server < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert slow_clients.closed_by_server == 200  # each closed: for room, or at its deadline
    assert all(a.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for a in slow_clients.answers)
    assert server.metric('modelpress_request_failures_total{code="408"') > before
    _control(server, model)


def test_a_request_cut_by_the_drain_timeout_gets_503_and_is_reported(tmp_path):
    record = tmp_path / "serve.json"
    path = slow(tmp_path / "slow.onnx", layers=2)
    srv = ServerProcess([str(path), "--drain-timeout", "1", "--json", str(record)])
    x = np.zeros((1, 256, 512), np.float32)
    header = _v2(
        [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    )
    body = header + x.tobytes()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(header)) + body[:1000]
    )
    deadline = time.monotonic() + 30
    while srv.metric("modelpress_requests_in_progress") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    srv.terminate()  # the body never completes: cut at --drain-timeout 1
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 503")
    assert "--drain-timeout" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert srv.proc.wait(timeout=60) == 0
    assert "1 accepted requests were not answered" in srv.proc.stdout.read()
    result = json.loads(record.read_text())["result"]
    assert result["cut"] == 1 and result["models"][0]["failures"] == {"503": 1}


def test_header_deadlines_close_idle_connections_quietly_and_late_requests_with_408(server, model):
    """After an answer, a keep-alive connection on which nothing comes is closed without a word
    (a client reusing it must not read a 408 as its next answer); one whose next request has
    begun but not finished its headers --header-timeout after its first byte gets a 408; so does
    a new connection that sends nothing. All in one test: each closes in about 2 s."""
    before = server.metric('modelpress_request_failures_total{code="408"')
    x = np.zeros((1, 3, 8, 8), np.float32)
    header = _v2(
        [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    )
    request = (
        b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n"
        % (len(header) + x.nbytes, len(header))
        + header
        + x.tobytes()
    )
    idle, partial, silent = (
        socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)
    )
    for s in (idle, partial):
        s.sendall(request)
        reader = s.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200")
        length = 0
        while (line := reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        assert len(reader.read(length)) == length
    partial.sendall(b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: t\r\n")
    assert idle.recv(65536) == b""  # closed, nothing said
    for s in (partial, silent):
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408")
        assert "did not arrive within 2 s" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    for s in (idle, partial, silent):
        s.close()
    assert server.metric('modelpress_request_failures_total{code="408"') == before + 2
    _control(server, model)
