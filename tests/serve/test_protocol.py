"""The v2 codec against tritonclient's own encoder and decoder (the reference), and malformed bodies."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.http._utils import _get_inference_request

from modelpress.serve.errors import RequestError
from modelpress.serve.protocol import InferRequest, decode_request, decompress, encode_response


def _client_body(arrays: dict[str, np.ndarray], *, binary: bool, outputs=None):
    inputs = []
    for name, arr in arrays.items():
        datatype = "BYTES" if arr.dtype == object else th.np_to_triton_dtype(arr.dtype)
        i = th.InferInput(name, list(arr.shape), datatype)
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    return _get_inference_request(inputs, "req-7", outputs, 0, False, False, 0, None, None)


ARRAYS = {
    "f32": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "f16": np.linspace(-2, 2, 6, dtype=np.float16).reshape(2, 3),
    "i64": np.array([[1, -(2**40)], [3, 2**62]], dtype=np.int64),
    "u8": np.arange(10, dtype=np.uint8),
    "b": np.array([True, False, True]),
    "s": np.array([b"caf\xc3\xa9", b"", b"text"], dtype=object),
}


@pytest.mark.parametrize("binary", [True, False])
def test_requests_from_tritonclient_decode_to_the_same_arrays(binary):
    body, json_size = _client_body(ARRAYS, binary=binary)
    req = decode_request(body, header_length=json_size)
    assert req.id == "req-7" and req.binary_output  # no outputs named: binary_data_output is set
    for name, arr in ARRAYS.items():
        got = req.inputs[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype, name
        if arr.dtype == object:
            assert list(got.reshape(-1)) == list(arr.reshape(-1))
        else:
            np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("binary", [True, False])
def test_responses_decode_in_tritonclient_to_the_same_arrays(binary):
    outputs = {k: v for k, v in ARRAYS.items()}
    request = InferRequest(inputs={}, id="r1", binary_output=binary)
    body, headers = encode_response(outputs, model_name="m", request=request)
    length = headers.get("inference-header-content-length")
    result = th.InferResult.from_response_body(body, header_length=int(length) if length else None)
    assert result.get_response()["id"] == "r1"
    for name, arr in outputs.items():
        got = result.as_numpy(name)
        assert got.shape == arr.shape, name
        if arr.dtype == object:
            assert [
                bytes(v) if isinstance(v, bytes) else v.encode() for v in got.reshape(-1)
            ] == list(arr.reshape(-1))
        else:
            assert got.dtype == arr.dtype
            np.testing.assert_array_equal(got, arr)


def test_per_output_binary_flag_overrides_the_request_default():
    body, size = _client_body(
        {"x": ARRAYS["f32"]}, binary=True, outputs=[th.InferRequestedOutput("y", binary_data=False)]
    )
    req = decode_request(body, header_length=size)
    body, headers = encode_response({"y": ARRAYS["f32"]}, model_name="m", request=req)
    assert "inference-header-content-length" not in headers
    assert json.loads(body)["outputs"][0]["data"] == ARRAYS["f32"].reshape(-1).tolist()


def _status(body: bytes, header_length=None) -> tuple[int, str]:
    with pytest.raises(RequestError) as info:
        decode_request(body, header_length=header_length)
    return info.value.status, info.value.message


def test_malformed_bodies_are_400_naming_the_problem():
    body, size = _client_body({"x": ARRAYS["f32"]}, binary=True)
    assert _status(body[:-5], size)[1].startswith("input 'x': the body ends 5 bytes before")
    assert "no input declares" in _status(body + b"xx", size)[1]
    assert "not valid JSON" in _status(body, size - 3)[1]
    assert "only" in _status(body, len(body) + 1)[1]
    assert _status(b'{"inputs": []}')[1] == "the request has no 'inputs' list"
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}
    assert "has 4 elements, 'data' has 3" in _status(json.dumps(doc).encode())[1]
    doc["inputs"][0].update(datatype="FP33")
    assert "datatype 'FP33'" in _status(json.dumps(doc).encode())[1]
    doc["inputs"][0].update(datatype="INT8", shape=[1], data=[300])
    assert "not INT8" in _status(json.dumps(doc).encode())[1]
    doc["inputs"][0].update(datatype="FP32", shape=[-1], data=[1])
    assert "non-negative integers" in _status(json.dumps(doc).encode())[1]
    doc["inputs"][0].update(datatype="BYTES", shape=[1], data=[7])
    assert "must be strings" in _status(json.dumps(doc).encode())[1]
    bad_bytes = json.dumps(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": 6},
                }
            ]
        }
    ).encode()
    status, msg = _status(bad_bytes + (3).to_bytes(4, "little") + b"ab", len(bad_bytes))
    assert status == 400 and "needs at least 8 bytes" in msg


def test_compressed_requests_inflate_within_the_limit():
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.5]}]}
    ).encode()
    assert decompress(gzip.compress(body), "gzip", limit=1000) == body
    assert decompress(zlib.compress(body), "deflate", limit=1000) == body
    bomb = gzip.compress(b"\0" * 100_000)
    with pytest.raises(RequestError) as info:
        decompress(bomb, "gzip", limit=1000)
    assert info.value.status == 413
    with pytest.raises(RequestError) as info:
        decompress(gzip.compress(body)[:-10], "gzip", limit=1000)
    assert info.value.status == 400
    with pytest.raises(RequestError) as info:
        decompress(body, "br", limit=1000)
    assert info.value.status == 415


def test_fields_of_any_json_type_give_request_errors_only():
    """Every field of a request given values of every JSON type (a seeded fuzz): decoding either
    succeeds or raises RequestError (a 400), never another exception (a 500)."""
    import random

    values = [None, True, 1, -1, 2**70, 1.5, "x", "FP32", "BYTES", "BOOL", "INT8", [], [1],
              ["a"], [True], {}, {"a": 1}, [[1]], [2, 2], [[1, 2], [3]], ["NaN"], [1e39],
              {"binary_data_size": 4}, {"binary_data_size": "4"}, {"shared_memory_region": 1}]  # fmt: skip
    rng = random.Random(0)
    decoded = 0
    for _ in range(3000):
        tensor = {
            k: rng.choice(values)
            for k in ("name", "datatype", "shape", "data", "parameters")
            if rng.random() < 0.8
        }
        if rng.random() < 0.5:
            tensor.update(name="x", datatype=rng.choice(["FP32", "INT8", "BOOL"]))
        if rng.random() < 0.5:
            tensor.update(shape=[1], data=[1])
        doc = {
            "inputs": [tensor],
            "outputs": rng.choice([None, [{"name": "y", "parameters": rng.choice(values)}]]),
            "parameters": rng.choice(values),
            "id": rng.choice(values),
        }
        header = json.dumps(doc).encode()
        tail = bytes(rng.randrange(0, 12)) if rng.random() < 0.5 else b""
        try:
            decode_request(header + tail, header_length=len(header))
            decoded += 1
        except RequestError as exc:
            assert exc.status == 400
    assert decoded > 0  # some were valid


def test_a_repeated_header_is_read_once_and_each_body_keeps_its_own_tensors():
    """decode_request keeps a parsed header for the next request with the same header bytes, and
    encode_response keeps the JSON header of all-binary answers: answers must still be each
    request's own, and a body that does not fit a kept header still a 400."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    body_a, size_a = _client_body({"x": a}, binary=True)
    body_b, size_b = _client_body({"x": b}, binary=True)
    assert body_a[:size_a] == body_b[:size_b]  # the same header, other tensor bytes
    for body, want in ((body_a, a), (body_b, b), (body_a, a)):
        got = decode_request(body, header_length=size_a).inputs["x"]
        np.testing.assert_array_equal(got, want)
    for cut in (body_a[:-4], body_a + b"\0\0\0\0"):
        with pytest.raises(RequestError) as info:
            decode_request(cut, header_length=size_a)
        assert info.value.status == 400 and "binary data" in info.value.message
    for arr, request_id in ((a, "r1"), (b, "r1"), (b[:1], "r2"), (a[:1], None)):
        request = InferRequest(inputs={}, id=request_id, binary_output=True)
        payload, headers = encode_response({"y": arr}, model_name="m", request=request)
        length = int(headers["inference-header-content-length"])
        result = th.InferResult.from_response_body(payload, header_length=length)
        assert result.get_response().get("id") == request_id
        np.testing.assert_array_equal(result.as_numpy("y"), arr)
