"""``modelpress serve`` in its own process, talked to by tritonclient (a client from outside the
project) and by raw HTTP for the requests a client library would never send.

Answers are compared with ONNX Runtime on the same inputs, request by request. Rows computed in a
batch may differ from rows computed alone by float rounding (other GEMM blocking), hence rtol 1e-5.
"""

from __future__ import annotations

import http.client
import json
import socket

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
from serve_testing import VOCAB, ServerProcess, cnn, encoder, nonzero
from tritonclient.utils import InferenceServerException

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {
        "cnn": cnn(d / "cnn.onnx"),
        "encoder": encoder(d / "encoder.onnx"),
        "nonzero": nonzero(d / "nz.onnx"),
    }


@pytest.fixture(scope="module")
def server(models):
    srv = ServerProcess(
        [
            str(models["cnn"]),
            str(models["encoder"]),
            str(models["nonzero"]),
            "--name",
            "cnn,enc,nz",
            "--max-batch",
            "8",
            "--max-delay-ms",
            "20",
            "--max-body-mb",
            "1",
        ]
    )
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return th.InferenceServerClient(server.url, concurrency=16, network_timeout=60)


def ref(path, feeds):
    return ort.InferenceSession(str(path)).run(None, feeds)[0]


def _input(name, arr, binary=True, datatype=None):
    i = th.InferInput(name, list(arr.shape), datatype or th.np_to_triton_dtype(arr.dtype))
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


def _post(server, path, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_metadata_names_config_and_health(client, server):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("cnn") and not client.is_model_ready("absent")
    meta = client.get_model_metadata("enc")
    assert meta["inputs"] == [
        {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
    ]
    assert meta["outputs"] == [{"name": "pooled", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.get_model_config("cnn")["max_batch_size"] == 8
    assert client.get_model_config("nz")["max_batch_size"] == 0  # its output is not per row
    assert [m["name"] for m in client.get_model_repository_index()] == ["cnn", "enc", "nz"]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("absent")
    assert info.value.status() == "404" and "no model named 'absent'" in info.value.message()


@pytest.mark.parametrize("binary", [True, False])
def test_infer_binary_and_json_tensors_equal_onnxruntime(client, models, binary):
    x = np.random.default_rng(3).standard_normal((3, 3, 10, 10)).astype(np.float32)
    out = th.InferRequestedOutput("logits", binary_data=binary)
    result = client.infer("cnn", [_input("x", x, binary)], outputs=[out], request_id="abc")
    assert result.get_response()["id"] == "abc"
    np.testing.assert_allclose(
        result.as_numpy("logits"), ref(models["cnn"], {"x": x}), rtol=RTOL, atol=ATOL
    )
    # the default of tritonclient: no outputs named, binary inputs and outputs
    default = client.infer("cnn", [_input("x", x)])
    np.testing.assert_allclose(
        default.as_numpy("logits"), ref(models["cnn"], {"x": x}), rtol=RTOL, atol=ATOL
    )


def test_concurrent_requests_of_mixed_shapes_each_get_their_own_answer(client, models, server):
    rng = np.random.default_rng(4)
    cnn_shapes = [
        (1, 3, 8, 8),
        (2, 3, 8, 8),
        (1, 3, 6, 6),
        (3, 3, 8, 8),
        (1, 3, 6, 9),
        (2, 3, 6, 6),
    ] * 3
    jobs = []
    for shape in cnn_shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        jobs.append(("cnn", {"x": x}, client.async_infer("cnn", [_input("x", x)])))
    for rows, seq in [(1, 5), (2, 7), (1, 7), (3, 5), (2, 5)] * 3:
        ids = rng.integers(0, VOCAB, (rows, seq)).astype(np.int64)
        mask = (rng.random((rows, seq)) < 0.8).astype(np.int64)
        mask[:, 0] = 1
        feeds = {"ids": ids, "mask": mask}
        jobs.append(
            ("enc", feeds, client.async_infer("enc", [_input(k, v) for k, v in feeds.items()]))
        )
    for rows in (1, 2, 1, 3) * 3:
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        jobs.append(("nz", {"x": x}, client.async_infer("nz", [_input("x", x)])))
    paths = {"cnn": models["cnn"], "enc": models["encoder"], "nz": models["nonzero"]}
    for name, feeds, job in jobs:
        result = job.get_result()
        output = {"cnn": "logits", "enc": "pooled", "nz": "idx"}[name]
        expected = ref(paths[name], feeds)
        got = result.as_numpy(output)
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    assert server.metric("modelpress_request_failures_total") == 0


def _error(excinfo) -> tuple[str, str]:
    return excinfo.value.status(), excinfo.value.message()


def test_wrong_name_dtype_or_shape_is_400_naming_the_input(client):
    x = np.zeros((1, 3, 8, 8), np.float32)
    cases = [
        ([_input("image", x)], "model 'cnn' has no input 'image' (inputs: x)"),
        ([_input("x", x.astype(np.float64))], "input 'x' is FP64, model 'cnn' expects FP32"),
        (
            [_input("x", x[:, :2])],
            "input 'x' has shape [1, 2, 8, 8], model 'cnn' expects [-1, 3, -1, -1]",
        ),
        ([_input("x", x[0])], "input 'x' has shape [3, 8, 8], model 'cnn' expects [-1, 3, -1, -1]"),
    ]
    for inputs, message in cases:
        with pytest.raises(InferenceServerException) as info:
            client.infer("cnn", inputs)
        assert _error(info) == ("400", message)
    ids = np.zeros((1, 5), np.int64)
    with pytest.raises(InferenceServerException) as info:
        client.infer("enc", [_input("ids", ids), _input("mask", np.ones((1, 6), np.int64))])
    assert _error(info) == (
        "400",
        "input 'mask' has size 6 on axis 1 ('seq'), but input 'ids' has 5 there: model 'enc' needs them equal",
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("enc", [_input("ids", ids)])
    assert _error(info) == ("400", "input 'mask' of model 'enc' is missing")
    with pytest.raises(InferenceServerException) as info:
        client.infer("cnn", [_input("x", x)], outputs=[th.InferRequestedOutput("probs")])
    assert _error(info) == ("400", "model 'cnn' has no output 'probs' (outputs: logits)")
    with pytest.raises(InferenceServerException) as info:
        client.infer("absent", [_input("x", x)])
    assert info.value.status() == "404"


def test_truncated_oversize_and_garbled_bodies_get_their_status_and_the_server_goes_on(
    client, server, models
):
    x = np.ones((1, 3, 8, 8), np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1, 3, 8, 8],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    hdr = {"Inference-Header-Content-Length": str(len(header))}
    status, _, body = _post(server, "/v2/models/cnn/infer", header + x.tobytes()[:-7], hdr)
    assert status == 400 and "before its binary data does" in json.loads(body)["error"]
    big = np.ones((1, 3, 300, 300), np.float32)  # 1.08 MB > --max-body-mb 1
    with pytest.raises(InferenceServerException) as info:
        client.infer("cnn", [_input("x", big)])
    assert info.value.status() == "413"
    status, _, body = _post(
        server, "/v2/models/cnn/infer", b"{not json", {"Content-Type": "application/json"}
    )
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]
    status, _, _ = _post(
        server, "/v2/models/cnn/infer", b"\x00" * 64, {"Inference-Header-Content-Length": "9999"}
    )
    assert status == 400
    # and it still answers correctly
    result = client.infer("cnn", [_input("x", x)])
    np.testing.assert_allclose(
        result.as_numpy("logits"), ref(models["cnn"], {"x": x}), rtol=RTOL, atol=ATOL
    )


def test_a_request_the_model_fails_on_does_not_harm_its_batch(client, models, server):
    rng = np.random.default_rng(5)
    good = []
    jobs = []
    for i in range(9):
        ids = rng.integers(0, VOCAB, (1, 6)).astype(np.int64)
        if i == 4:
            ids[0, 2] = VOCAB + 7  # out of the embedding table: ONNX Runtime refuses the run
        mask = np.ones((1, 6), np.int64)
        jobs.append(client.async_infer("enc", [_input("ids", ids), _input("mask", mask)]))
        good.append(None if i == 4 else {"ids": ids, "mask": mask})
    for feeds, job in zip(good, jobs):
        if feeds is None:
            with pytest.raises(InferenceServerException) as info:
                job.get_result()
            # the client learns which input and what is wrong; not the op, nor the table's size
            message = info.value.message()
            assert info.value.status() == "400" and "values of input 'ids'" in message
            assert "Gather" not in message and str(VOCAB) not in message
        else:
            np.testing.assert_allclose(
                job.get_result().as_numpy("pooled"),
                ref(models["encoder"], feeds),
                rtol=RTOL,
                atol=ATOL,
            )


def test_metrics_count_requests_failures_batches_and_busy_time(server):
    assert server.metric('modelpress_requests_total{model="cnn"}') > 0
    assert server.metric('modelpress_request_failures_total{code="400"') > 0
    assert server.metric('modelpress_request_duration_seconds_count{model="cnn"}') == server.metric(
        'modelpress_requests_total{model="cnn"}'
    )
    assert server.metric('modelpress_busy_seconds_total{model="cnn"}') > 0
    assert server.metric('modelpress_batch_size_sum{model="cnn"}') == server.metric(
        'modelpress_inferences_total{model="cnn"}'
    )
    assert server.metric("modelpress_queue_depth") == 0


def test_every_spelling_of_the_infer_path_gets_the_same_answers(server, models):
    """The infer route runs in front of FastAPI's router: versioned paths, pipelined requests on
    one keep-alive connection, and the paths and methods it does not take still get JSON errors."""
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 6)).astype(np.float32)
    want = ref(models["cnn"], {"x": x})
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3, 6, 6], "data": []}]}
    doc["inputs"][0]["data"] = x.reshape(-1).tolist()
    body = json.dumps(doc).encode()
    json_type = {"Content-Type": "application/json"}
    for path in ("/v2/models/cnn/infer", "/v2/models/cnn/versions/1/infer"):
        status, headers, answer = _post(server, path, body, json_type)
        assert status == 200 and headers["content-type"] == "application/json"
        assert int(headers["content-length"]) == len(answer)
        got = np.array(json.loads(answer)["outputs"][0]["data"], np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    cases = [
        ("/v2/models/cnn/versions/7/infer", 404, "no version '7'"),
        ("/v2/models/absent/infer", 404, "no model named 'absent'"),
        ("/v2/models//infer", 404, "Not Found"),
    ]
    for path, code, words in cases:
        status, headers, answer = _post(server, path, body, json_type)
        assert (status, headers.get("content-type")) == (code, "application/json"), path
        assert words in json.loads(answer)["error"], path
    status, headers, _ = _post(server, "/v2/models/cnn/infer/", body, json_type)
    assert status == 307 and headers["location"].endswith("/v2/models/cnn/infer")  # FastAPI's
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v2/models/cnn/infer")
    r = conn.getresponse()
    assert r.status == 405 and "error" in json.loads(r.read())
    conn.close()
    # three requests written at once on one connection: three answers, in order
    one = b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall((one + body) * 3)
        reader = s.makefile("rb")
        for _ in range(3):
            status = reader.readline().split()[1]
            length = 0
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            assert status == b"200"
            got = json.loads(reader.read(length))["outputs"][0]["data"]
            np.testing.assert_allclose(
                np.array(got, np.float32).reshape(want.shape), want, rtol=RTOL, atol=ATOL
            )
