"""Post-processing: one model output turned into one JSON-able answer per item.

``softmax`` (``exp(x - max) / sum``, over the last axis) or ``sigmoid`` first; then, when any of
``argmax``, ``topk=K`` or ``threshold=T`` is given, the answer is the ranked classes
``{"classes": [{"index", "score", "label"}...]}``: highest score first (ties: lower index first),
those under ``T`` left out, at most ``K`` (``argmax`` is ``topk=1``), each named from ``labels``
(a file with one label per line, stored in the model) when there are labels. Without a ranking
step the answer is ``{output_name: values}``.

Precondition: the output is ``(batch, classes)`` (middle axes of size 1 are allowed), and a label
map has exactly one label per class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
}


@dataclass(frozen=True)
class Post:
    output: str
    softmax: bool = False
    sigmoid: bool = False
    topk: int | None = None
    threshold: float | None = None
    labels: tuple[str, ...] | None = None

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
        if labels is not None:
            if not labels or not all(labels):
                raise fail("post.labels", "every class needs a label: one non-empty line per class")
            if classes is not None and len(labels) != classes:
                raise fail(
                    "post.labels",
                    f"{len(labels)} labels for {classes} classes in the model's output {target.describe()}",
                )
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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"output": self.output}
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


def _labels(values: list | tuple) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in values):
        raise fail("post.labels", "a list of labels must hold strings")
    return tuple(values)
