"""Whether a batch may be split: decided from the graph (golden cases), and what `run
--batch-size` does with each answer, checked against ONNX Runtime on the whole batch."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from mp_testing import model_from_text

from modelpress.cli.main import main
from modelpress.errors import InputError
from modelpress.ir import model_bytes, save
from modelpress.ir.feeds import check_feeds
from modelpress.runtime.batch import batch_rule

H = '<ir_version: 8, opset_import: ["" : 17]>\n'

PER_SAMPLE = {
    "cnn": "g (float[N, 3, 4, 4] x) => (float[N, 2] y) <float[3, 2] w = {1,2,3,4,5,6}> { p = GlobalAveragePool(x)\n f = Flatten(p)\n y = MatMul(f, w) }",
    "reshape -1": "g (float[N, 3, 4, 4] x) => (float[N, 48] y) <int64[2] s = {-1, 48}> { y = Reshape(x, s) }",
    "runtime shape": "g (float[batch, 3, 4] x) => (float[batch, 12] y) <int64[1] z = {0}, int64[1] m = {-1}> { sh = Shape(x)\n n = Gather<axis=0>(sh, z)\n s = Concat<axis=0>(n, m)\n y = Reshape(x, s) }",
    "softmax last": "g (float[N, 3] x) => (float[N, 3] y) { y = Softmax<axis=1>(x) }",
    "embedding": "g (int64[N, S] ids) => (float[N, S, 2] y) <float[5, 2] e = {1,2,3,4,5,6,7,8,9,10}> { y = Gather<axis=0>(e, ids) }",
    "dims -1 and 0": "g (float[-1, 3] x, float[0, 3] z) => (float[-1, 3] y) { y = Add(x, z) }",
    "static 1": "g (float[1, 3] x) => (float[1, 3] y) { y = Relu(x) }",
}
WHOLE = {
    "softmax over batch": (
        "g (float[N, 3] x) => (float[N, 3] y) { y = Softmax<axis=0>(x) }",
        "Softmax 'y' works across samples (axis 0)",
    ),
    "batch statistics": (
        "g (float[N, 3] x) => (float[N, 3] y) <int64[1] a = {0}> { m = ReduceMean<keepdims=1>(x)\n y = Sub(x, m) }",
        "ReduceMean 'm' works across samples",
    ),
    "gram matrix": (
        "g (float[N, 3] x) => (float[N, 3] y) { t = Transpose(x)\n gm = MatMul(t, x)\n y = MatMul(x, gm) }",
        "MatMul 'gm' does not keep the batch axis",
    ),
    "flatten all": (
        "g (float[N, 3] x) => (float[1, K] y) { y = Flatten<axis=0>(x) }",
        "Flatten 'y' does not keep the batch axis",
    ),
    "nms": (
        "g (float[N, 5, 4] b, float[N, 1, 5] s) => (int64[K, 3] y) { y = NonMaxSuppression(b, s) }",
        "NonMaxSuppression 'y' works on the whole batch",
    ),
    "names differ": (
        "g (float[A, 3] x, float[B, 3] z) => (float[A, 3] y) { y = Add(x, z) }",
        "different names (A, B)",
    ),
    "static 2": (
        "g (float[2, 3] x) => (float[2, 3] y) { y = Softmax<axis=0>(x) }",
        "Softmax 'y' works across samples",
    ),
}


@pytest.mark.parametrize("name", PER_SAMPLE)
def test_per_sample_models(name):
    rule = batch_rule(model_from_text(H + PER_SAMPLE[name]))
    assert rule.per_sample and rule.reason == ""
    assert rule.fixed == (1 if name == "static 1" else None)


@pytest.mark.parametrize("name", WHOLE)
def test_models_that_mix_samples(name):
    text, reason = WHOLE[name]
    rule = batch_rule(model_from_text(H + text))
    assert not rule.per_sample and reason in rule.reason


def test_subgraphs_and_the_models_own_word():
    flow = model_from_text(
        H
        + """g (float[N, 3] x) => (float[N, 3] y) {
      c = Constant<value = bool {1}>()
      y = If(c) <then_branch = g1 () => (float[N, 3] a) { a = Relu(x) }, else_branch = g2 () => (float[N, 3] b) { b = Neg(x) }>
    }"""
    )
    assert "If 'y' has a subgraph" in batch_rule(flow).reason
    flow.metadata_props["modelpress.batch"] = "per-sample"
    assert batch_rule(flow).per_sample
    m = model_from_text(H + PER_SAMPLE["cnn"])
    m.metadata_props["modelpress.batch"] = "whole"
    assert not batch_rule(m).per_sample


# A detector head: scores per box and NonMaxSuppression, whose output rows carry batch indices.
DETECTOR = (
    H
    + """g (float[N, 6, 4] boxes, float[N, 1, 6] scores) => (int64[K, 3] selected) <int64[1] k = {2}, float[1] iou = {0.5}> {
  selected = NonMaxSuppression(boxes, scores, k, iou)
}"""
)


def test_run_keeps_a_detector_batch_whole_and_says_why(tmp_path, capsys):
    model = model_from_text(DETECTOR)
    save(model, tmp_path / "det.onnx")
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 10, (8, 6, 2)).astype(np.float32)
    feeds = {
        "boxes": np.concatenate([xy, xy + 2], axis=2),
        "scores": rng.uniform(0, 1, (8, 1, 6)).astype(np.float32),
    }
    np.savez(tmp_path / "in.npz", **feeds)
    args = [
        "run",
        str(tmp_path / "det.onnx"),
        str(tmp_path / "in.npz"),
        "-o",
        str(tmp_path / "out.npz"),
        "--batch-size",
        "4",
    ]
    assert main(args) == 0
    assert "ran the batch whole because NonMaxSuppression" in capsys.readouterr().err
    want = ort.InferenceSession(model_bytes(model)).run(None, feeds)[0]
    got = np.load(tmp_path / "out.npz")["selected"]
    np.testing.assert_array_equal(got, want)
    assert set(got[:, 0]) == set(range(8))  # batch indices 0-7, not 0-3 twice


def test_run_splits_a_per_sample_model_with_the_same_answers(tmp_path, capsys):
    model = model_from_text(H + PER_SAMPLE["runtime shape"])
    save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((7, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert (
        main(
            [
                "run",
                str(tmp_path / "m.onnx"),
                "--data",
                str(tmp_path / "in.npz"),
                "-o",
                str(tmp_path / "o.npz"),
                "--batch-size",
                "3",
            ]
        )
        == 0
    )
    assert "note:" not in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x.reshape(7, 12))


def test_dims_written_minus_one_or_zero_take_any_size(tmp_path):
    model = model_from_text(H + "g (float[-1, 3] x) => (float[-1, 3] y) { y = Relu(x) }")
    for n in (1, 3):
        check_feeds(model, {"x": np.zeros((n, 3), np.float32)})
    with pytest.raises(InputError, match="has size 4 on axis 1, the model expects 3"):
        check_feeds(model, {"x": np.zeros((2, 4), np.float32)})
    save(model, tmp_path / "m.onnx")
    x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    np.savez(tmp_path / "one.npz", x=x)
    for backend in ("ort", "torch"):
        out = tmp_path / f"{backend}.npz"
        assert (
            main(
                [
                    "run",
                    str(tmp_path / "m.onnx"),
                    str(tmp_path / "one.npz"),
                    "-o",
                    str(out),
                    "--backend",
                    backend,
                ]
            )
            == 0
        )
        np.testing.assert_array_equal(np.load(out)["y"], np.maximum(x, 0))
