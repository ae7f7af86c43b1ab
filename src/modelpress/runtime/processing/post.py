"""Post-processing: one model output turned into one JSON-able answer per item.

``softmax`` (``exp(x - max) / sum``, over the last axis) or ``sigmoid`` first; then, when any of
``argmax``, ``topk=K`` or ``threshold=T`` is given, the answer is the ranked classes
``{"classes": [{"index", "score", "label"}...]}``: highest score first (ties: lower index first),
those under ``T`` left out, at most ``K`` (``argmax`` is ``topk=1``), each named from ``labels``
(a file with one label per line, stored in the model) when there are labels. Without a ranking
step the answer is ``{output_name: values}``.

Precondition: the output is ``(batch, classes)`` (middle axes of size 1 are allowed), and a label
map has exactly one label per class.

``boxes=LAYOUT`` (``yolo``, ``rows``, ``yolov5``: see ``boxes.py``) reads a detector's raw output
``(batch, 4 + C, N)`` or ``(batch, N, 4 + C)`` instead: boxes decoded, non-maximum suppression at
``iou`` (default 0.45), scores of at least ``threshold`` (default 0.25), at most ``topk`` (default
100); the answer is ``{"boxes": [{"box": [x1, y1, x2, y2], "index", "score", "label"}...]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelpress.runtime.processing.boxes import LAYOUTS, decode, nms
from modelpress.runtime.processing.fields import (
    as_bool,
    as_float,
    as_int,
    as_name,
    convert_fields,
    fail,
    read_text_file,
)
from modelpress.runtime.processing.signature import Tensor

KEYS = {
    "output": as_name,
    "softmax": as_bool,
    "sigmoid": as_bool,
    "argmax": as_bool,
    "topk": as_int,
    "threshold": as_float,
    "labels": lambda field, v: v,  # a path or a list, read by ``declare``
    "boxes": as_name,
    "iou": as_float,
}


@dataclass(frozen=True)
class Post:
    output: str
    softmax: bool = False
    sigmoid: bool = False
    topk: int | None = None
    threshold: float | None = None
    labels: tuple[str, ...] | None = None
    boxes: str | None = None  # a detector's layout (boxes.LAYOUTS): decoded, then NMS
    iou: float = 0.45

    @classmethod
    def declare(
        cls, raw: dict[str, Any], model_outputs: list[Tensor], *, base: Path | None = None
    ) -> Post:
        raw = dict(raw)
        labels = (
            _labels(raw.pop("labels"))
            if "labels" in raw and isinstance(raw["labels"], (list, tuple))
            else None
        )
        if labels is None and "labels" in raw:
            text = read_text_file("post.labels", raw.pop("labels"), base)
            labels = tuple(line.strip() for line in text.rstrip("\n").split("\n"))
        f = convert_fields(raw, KEYS, where="post")
        names = [t.name for t in model_outputs]
        name = f.get("output", names[0] if names else None)
        target = next((t for t in model_outputs if t.name == name), None)
        if target is None:
            raise fail(
                "post.output", f"the model has no output {name!r} (outputs: {', '.join(names)})"
            )
        if f.get("softmax") and f.get("sigmoid"):
            raise fail("post.sigmoid", "give softmax or sigmoid, not both")
        if f.get("argmax") and "topk" in f:
            raise fail("post.argmax", "argmax is topk=1: give one of them")
        if "boxes" in f or "iou" in f:
            return cls._detector(f, target, labels)
        topk = 1 if f.get("argmax") else f.get("topk")
        ranked = topk is not None or "threshold" in f or labels is not None
        dims = target.dims
        if ranked and dims is not None:
            if len(dims) < 2 or any(d != 1 for d in dims[1:-1]):
                raise fail(
                    "post.output",
                    f"ranking classes needs a (batch, classes) output, {target.describe()} is not",
                )
        classes = dims[-1] if dims else None
        if labels is not None and not (labels and all(labels)):
            raise fail("post.labels", "every class needs a label: one non-empty line per class")
        _check_labels(labels, classes, target)
        if topk is not None and classes is not None and topk > classes:
            raise fail(
                "post.topk",
                f"{topk} asked, the model's output {target.describe()} has {classes} classes",
            )
        return cls(
            output=target.name,
            softmax=f.get("softmax", False),
            sigmoid=f.get("sigmoid", False),
            topk=topk,
            threshold=f.get("threshold"),
            labels=labels,
        )

    @classmethod
    def _detector(cls, f: dict, target: Tensor, labels) -> Post:
        layout = f.get("boxes")
        if layout not in LAYOUTS:
            raise fail("post.boxes", f"{layout!r}: choose one of {', '.join(LAYOUTS)}")
        if f.get("softmax") or f.get("argmax"):
            raise fail("post.boxes", "boxes take class scores as they are: no softmax or argmax")
        iou = f.get("iou", 0.45)
        if not 0 <= iou <= 1:
            raise fail("post.iou", f"{iou}: choose a value in [0, 1]")
        dims = target.dims
        if dims is not None:
            if len(dims) != 3:
                raise fail(
                    "post.boxes",
                    f"a detector's output is (batch, 4 + classes, boxes) or (batch, boxes, "
                    f"4 + classes); {target.describe()} is not",
                )
            width = dims[1] if layout == "yolo" else dims[2]
            head = 5 if layout == "yolov5" else 4
            if isinstance(width, int) and width <= head:
                raise fail("post.boxes", f"{target.describe()} has no class scores for {layout}")
            if isinstance(width, int):
                _check_labels(labels, width - head, target)
        return cls(
            output=target.name,
            sigmoid=f.get("sigmoid", False),
            topk=f.get("topk", 100),
            threshold=f.get("threshold", 0.25),
            labels=labels,
            boxes=layout,
            iou=iou,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"output": self.output}
        if self.boxes is not None:
            d.update(boxes=self.boxes, iou=self.iou)
        for key in ("softmax", "sigmoid"):
            if getattr(self, key):
                d[key] = True
        if self.topk is not None:
            d["topk"] = self.topk
        if self.threshold is not None:
            d["threshold"] = self.threshold
        if self.labels is not None:
            d["labels"] = list(self.labels)
        return d

    @property
    def ranked(self) -> bool:
        return self.topk is not None or self.threshold is not None or self.labels is not None

    def scores(self, values: np.ndarray) -> np.ndarray:
        """Softmax or sigmoid of ``values`` over the last axis (in float64), or the values."""
        x = np.asarray(values, dtype=np.float64)
        if self.softmax:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        if self.sigmoid:
            return 1.0 / (1.0 + np.exp(-x))
        return x

    def answers(self, values: np.ndarray) -> list[dict[str, Any]]:
        """One answer per item (row along axis 0) of the output's ``values``."""
        if self.boxes is not None:
            return [self._detections(item) for item in np.asarray(values)]
        scores = self.scores(values)
        if not self.ranked:
            return [{self.output: row.tolist()} for row in scores]
        scores = scores.reshape(scores.shape[0], -1)
        if self.labels is not None and scores.shape[1] != len(self.labels):
            raise fail(
                "post.labels",
                f"{len(self.labels)} labels for an output of {scores.shape[1]} classes",
            )
        out = []
        for row in scores:
            order = np.argsort(-row, kind="stable")
            if self.threshold is not None:
                order = order[row[order] >= self.threshold]
            if self.topk is not None:
                order = order[: self.topk]
            classes = []
            for i in order:
                entry: dict[str, Any] = {"index": int(i), "score": float(row[i])}
                if self.labels is not None:
                    entry["label"] = self.labels[i]
                classes.append(entry)
            out.append({"classes": classes})
        return out

    def _detections(self, item: np.ndarray) -> dict[str, Any]:
        boxes, scores = decode(item, self.boxes)
        if self.sigmoid:
            scores = 1.0 / (1.0 + np.exp(-scores))
        kept = nms(boxes, scores, threshold=self.threshold or 0.0, iou=self.iou, limit=self.topk)
        out = []
        for d in kept:
            entry: dict[str, Any] = {
                "box": list(d.box),
                "index": d.cls,
                "score": d.score,
            }
            if self.labels is not None:
                if d.cls >= len(self.labels):
                    raise fail("post.labels", f"{len(self.labels)} labels for class index {d.cls}")
                entry["label"] = self.labels[d.cls]
            out.append(entry)
        return {"boxes": out}


def _labels(values: list | tuple) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in values):
        raise fail("post.labels", "a list of labels must hold strings")
    return tuple(values)


def _check_labels(labels: tuple[str, ...] | None, classes: int | None, target: Tensor) -> None:
    """One label per class of the model's output ``target`` (when both are known)."""
    if labels is not None and classes is not None and len(labels) != classes:
        raise fail(
            "post.labels",
            f"{len(labels)} labels for {classes} classes in the model's output {target.describe()}",
        )
