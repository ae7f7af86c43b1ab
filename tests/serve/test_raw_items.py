"""Raw items (an image file, a text) in, post-processed answers out, for a model that declares its
processing. The reference is the same ``runtime.processing.Processing`` run by hand around ONNX
Runtime: the server must apply exactly the steps the declaration stores."""

from __future__ import annotations

import io
import json

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th
from PIL import Image
from serve_testing import ServerProcess, cnn
from test_server import _post
from tritonclient.utils import InferenceServerException

from modelpress.ir import load, save
from modelpress.runtime.processing import Processing


def _png(seed: int, size=(12, 10)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    d = tmp_path_factory.mktemp("raw")
    model = load(cnn(d / "plain.onnx"))
    proc = Processing.declare(
        model, pre="image:resize=10,crop=8,layout=nchw", post="softmax,topk=3"
    )
    proc.store(model)
    save(model, d / "classifier.onnx")
    return d / "classifier.onnx", proc, d / "plain.onnx"


@pytest.fixture(scope="module")
def server(declared):
    path, _, plain = declared
    srv = ServerProcess([str(path), str(plain), "--max-delay-ms", "10"])
    yield srv
    assert srv.stop() == 0


def expected(declared, items):
    path, proc, _ = declared
    feeds = proc.preprocess(items)
    sess = ort.InferenceSession(str(path))
    return proc.postprocess(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))


def _close(got, want):
    """Same classes in the same order, scores equal to float rounding (a batched run may round
    differently from the reference's single run)."""
    assert [c["index"] for c in got["classes"]] == [c["index"] for c in want["classes"]]
    np.testing.assert_allclose(
        [c["score"] for c in got["classes"]],
        [c["score"] for c in want["classes"]],
        rtol=1e-5,
        atol=1e-7,
    )


def test_an_image_body_gets_the_post_processed_answer(server, declared):
    assert "raw items" in "".join(server.lines)
    for seed in range(3):
        png = _png(seed)
        status, _, body = _post(
            server, "/v2/models/classifier/infer", png, {"Content-Type": "image/png"}
        )
        assert status == 200, body
        _close(json.loads(body), expected(declared, [png])[0])


def test_a_bytes_tensor_of_items_through_tritonclient(server, declared):
    client = th.InferenceServerClient(server.url)
    items = [_png(10), _png(11, size=(20, 14)), _png(12)]
    raw = th.InferInput("raw", [len(items)], "BYTES")
    raw.set_data_from_numpy(np.array(items, dtype=object))
    result = client.infer("classifier", [raw])
    answers = [json.loads(a) for a in result.as_numpy("answer")]
    for got, want in zip(answers, expected(declared, items)):
        _close(got, want)
    # the tensors still work as before
    x = np.ones((1, 3, 8, 8), np.float32)
    i = th.InferInput("x", [1, 3, 8, 8], "FP32")
    i.set_data_from_numpy(x)
    assert client.infer("classifier", [i]).as_numpy("logits").shape == (1, 5)


def test_raw_items_are_refused_where_they_cannot_be_used(server):
    status, _, body = _post(
        server, "/v2/models/classifier/infer", b"not an image", {"Content-Type": "image/png"}
    )
    assert status == 400 and "cannot pre-process this item: item 0" in json.loads(body)["error"]
    status, _, body = _post(
        server, "/v2/models/plain/infer", _png(1), {"Content-Type": "image/png"}
    )
    assert status == 400 and "declares no pre-processing" in json.loads(body)["error"]
    client = th.InferenceServerClient(server.url)
    raw = th.InferInput("raw", [1], "BYTES")
    raw.set_data_from_numpy(np.array([_png(1)], dtype=object))
    with pytest.raises(InferenceServerException) as info:
        client.infer("plain", [raw])
    assert info.value.status() == "400" and "no input 'raw'" in info.value.message()
    assert client.is_server_live()
