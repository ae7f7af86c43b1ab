"""Detector post-processing: a YOLO-style raw output ([batch, 4 + C, N]) decoded into boxes and
reduced by non-maximum suppression, checked against ONNX Runtime's NonMaxSuppression; declared
with ``pipeline --post boxes=yolo`` and applied by ``run``. Before: nudenet's raw output made a
156 MB JSONL for 150 images (every candidate box of every image)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from modelpress.cli.main import main
from modelpress.errors import OptionError
from modelpress.ir import from_proto, save
from modelpress.runtime.processing import Processing
from modelpress.runtime.processing.boxes import decode, nms


def _raw(rng, classes=3, n=300, layout="yolo") -> np.ndarray:
    """Candidate boxes clustered around a few objects (so suppression has work to do)."""
    centres = rng.uniform(50, 590, size=(6, 2))
    which = rng.integers(0, 6, size=n)
    cxcy = centres[which] + rng.normal(0, 6, size=(n, 2))
    wh = rng.uniform(20, 80, size=(n, 2))
    scores = rng.uniform(0, 1, size=(n, classes)) ** 3
    rows = np.concatenate([cxcy, wh, scores], axis=1).astype(np.float32)  # (N, 4 + C)
    return rows.T if layout == "yolo" else rows


def _ort_reference(raw: np.ndarray, *, threshold: float, iou: float) -> set[tuple[int, int]]:
    """(class, box) pairs that ONNX Runtime's NonMaxSuppression keeps, each box scored for its
    best class only (one label a box)."""
    boxes, scores = decode(raw, "yolo")
    best = scores.argmax(1)
    one_label = np.zeros_like(scores)
    one_label[np.arange(len(best)), best] = scores[np.arange(len(best)), best]
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["b", "s", "k", "i", "t"], ["sel"])],
        "nms",
        [
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, None, 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, None, None]),
        ],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, [None, 3])],
        [
            helper.make_tensor("k", TensorProto.INT64, [1], [10_000]),
            helper.make_tensor("i", TensorProto.FLOAT, [1], [iou]),
            helper.make_tensor("t", TensorProto.FLOAT, [1], [threshold]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (sel,) = sess.run(
        None,
        {"b": boxes[None].astype(np.float32), "s": one_label.T[None].astype(np.float32)},
    )
    return {(int(c), int(b)) for _, c, b in sel}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_keeps_what_onnx_runtime_keeps(seed):
    raw = _raw(np.random.default_rng(seed))
    boxes, scores = decode(raw, "yolo")
    kept = nms(boxes, scores, threshold=0.2, iou=0.45, limit=None)
    assert {(d.cls, d.index) for d in kept} == _ort_reference(raw, threshold=0.2, iou=0.45)
    assert 0 < len(kept) < 100  # 300 candidates, a few objects: a short list
    assert [d.score for d in kept] == sorted((d.score for d in kept), reverse=True)
    assert nms(boxes, scores, threshold=0.2, iou=0.45, limit=5) == kept[:5]


def test_layouts_decode_the_same_boxes():
    rows = _raw(np.random.default_rng(3), layout="rows")
    b1, s1 = decode(rows.T, "yolo")
    b2, s2 = decode(rows, "rows")
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(s1, s2)
    cx, cy, w, h = rows[0, :4].astype(np.float64)
    np.testing.assert_allclose(b2[0], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    v5 = np.concatenate([rows[:, :4], np.full((len(rows), 1), 0.5, np.float32), rows[:, 4:]], 1)
    _, s5 = decode(v5, "yolov5")
    np.testing.assert_allclose(s5, 0.5 * s2, rtol=1e-12)  # objectness times class probability


def _detector(path, classes=3, n=300):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["images"], ["output0"])],
        "det",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 4 + classes, n])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 4 + classes, n])],
    )
    return save(
        from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])), path
    )


def test_pipeline_declares_boxes_and_run_writes_a_short_list(tmp_path):
    src = _detector(tmp_path / "det.onnx")
    out = tmp_path / "det-post.onnx"
    post = "boxes=yolo,threshold=0.3,iou=0.5,topk=20,labels=cat,dog,bird"
    assert main(["pipeline", str(src), "-o", str(out), "--post", post]) == 0
    rng = np.random.default_rng(4)
    raw = np.stack([_raw(rng), _raw(rng)])
    np.savez(tmp_path / "x.npz", images=raw)
    pred = tmp_path / "p.jsonl"
    assert (
        main(["run", str(out), str(tmp_path / "x.npz"), "-o", str(pred), "--batch-size", "1"]) == 0
    )
    lines = [json.loads(line) for line in pred.read_text().splitlines()]
    assert len(lines) == 2
    for line, item in zip(lines, raw):
        boxes, scores = decode(item, "yolo")
        want = nms(boxes, scores, threshold=0.3, iou=0.5, limit=20)
        got = line["boxes"]
        assert [(b["index"], b["label"]) for b in got] == [
            (d.cls, ["cat", "dog", "bird"][d.cls]) for d in want
        ]
        np.testing.assert_allclose([b["box"] for b in got], [d.box for d in want], rtol=1e-12)
        np.testing.assert_allclose([b["score"] for b in got], [d.score for d in want], rtol=1e-12)
    stored = Processing.from_model(from_proto(__import__("onnx").load(out)))
    assert stored.post.to_dict()["boxes"] == "yolo" and stored.post.iou == 0.5


def test_bad_box_declarations_are_one_line(tmp_path):
    model = from_proto(__import__("onnx").load(_detector(tmp_path / "det.onnx")))
    for post, field in [
        ("boxes=ssd", "post.boxes"),
        ("boxes=yolo,iou=2", "post.iou"),
        ("boxes=yolo,softmax", "post.boxes"),
        ("boxes=yolo,labels=a,b", "post.labels"),
    ]:
        with pytest.raises(OptionError, match=field):
            Processing.declare(model, post=post)
