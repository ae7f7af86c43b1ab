"""Box decoding and non-maximum suppression: a detector's raw output turned into a short list of
boxes per item (``post: boxes=yolo,threshold=0.25,iou=0.45,topk=100``).

Layouts of one item's output (the batch axis removed):

- ``yolo``: ``(4 + C, N)``, YOLOv8-style (and nudenet): rows ``cx, cy, w, h`` then ``C`` class
  scores, one column per candidate box;
- ``rows``: ``(N, 4 + C)``, the same transposed;
- ``yolov5``: ``(N, 5 + C)``: ``cx, cy, w, h``, an objectness, ``C`` class probabilities (a box's
  class score is objectness times class probability).

Rule (as Ultralytics' non-maximum suppression with one label a box): each candidate takes its best
class and that class's score; candidates scoring at least ``threshold`` are kept; then, class by
class, from the highest score down (ties: lower index first), a box is dropped when its
intersection over union with a box already kept exceeds ``iou``; the kept boxes of every class,
highest score first, at most ``limit``. Boxes are returned as ``x1, y1, x2, y2`` in the model's
coordinates (the input image's pixels for a YOLO export).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYOUTS = ("yolo", "rows", "yolov5")


@dataclass(frozen=True)
class Detection:
    index: int  # the candidate's position in the model's output
    cls: int
    score: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2


def decode(values: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """One item's output as boxes ``(N, 4)`` (x1, y1, x2, y2) and class scores ``(N, C)``."""
    x = np.asarray(values, dtype=np.float64)
    x = x.reshape(x.shape[-2:]) if x.ndim > 2 else x
    if layout == "yolo":
        x = x.T
    head = 5 if layout == "yolov5" else 4
    scores = x[:, head:] * x[:, 4:5] if layout == "yolov5" else x[:, head:]
    cx, cy, w, h = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    return boxes, scores


def iou_one_to_many(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of ``box`` with each row of ``others`` (x1, y1, x2, y2)."""
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(
    boxes: np.ndarray, scores: np.ndarray, *, threshold: float, iou: float, limit: int | None
) -> list[Detection]:
    """The detections kept by the rule of the module docstring."""
    if scores.shape[1] == 0 or len(boxes) == 0:
        return []
    cls = scores.argmax(axis=1)
    best = scores[np.arange(len(scores)), cls]
    candidates = np.flatnonzero(best >= threshold)
    kept: list[Detection] = []
    for c in np.unique(cls[candidates]):
        idx = candidates[cls[candidates] == c]
        idx = idx[np.argsort(-best[idx], kind="stable")]
        while len(idx):
            i, rest = idx[0], idx[1:]
            kept.append(Detection(int(i), int(c), float(best[i]), tuple(map(float, boxes[i]))))
            idx = rest[iou_one_to_many(boxes[i], boxes[rest]) <= iou]
    kept.sort(key=lambda d: (-d.score, d.index))
    return kept[:limit] if limit is not None else kept
