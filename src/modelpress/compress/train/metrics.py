"""The user's own measure of a compressed model, on held-out samples, under ONNX Runtime.

``compare(original, candidate, data)`` runs both models on ``data`` and reports, for the first
output: top-1 accuracy of each against integer labels (when there are labels and the output holds
class scores), top-1 agreement with the original (class scores), and the mean cosine similarity
of the candidate's outputs to the original's, per sample (any float output: embeddings too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.compress.train.data import TrainData
from modelpress.compress.train.objective import output_is_logits
from modelpress.runtime.ort import session


@dataclass
class Comparison:
    samples: int
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    agreement: float | None = None
    cosine: float | None = None

    @property
    def accuracy_drop(self) -> float | None:
        if self.accuracy_before is None or self.accuracy_after is None:
            return None
        return self.accuracy_before - self.accuracy_after

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "accuracy_before": self.accuracy_before,
            "accuracy_after": self.accuracy_after,
            "accuracy_drop": self.accuracy_drop,
            "agreement": self.agreement,
            "cosine": self.cosine,
        }


def outputs(
    model: ir.Model, data: TrainData, *, batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray | None]:
    """The first output of ``model`` on every sample of ``data`` (samples of one shape joined)
    and the labels, in data order."""

    sess = session(model, optimize="disabled")
    name = sess.get_outputs()[0].name
    outs, labels = [], []
    for batch in data.batches(batch_size):
        outs.append(sess.run([name], batch.feeds)[0])
        if batch.labels is not None:
            labels.append(batch.labels)
    flat = [o.reshape(o.shape[0], -1) for o in outs]
    return np.concatenate(flat), (np.concatenate(labels) if labels else None)


def compare(
    original: ir.Model, candidate: ir.Model, data: TrainData, *, batch_size: int = 64
) -> Comparison:
    a, labels = outputs(original, data, batch_size=batch_size)
    b, _ = outputs(candidate, data, batch_size=batch_size)
    result = Comparison(samples=len(a))
    if a.dtype.kind == "f":
        na = np.linalg.norm(a, axis=1)
        nb = np.linalg.norm(b, axis=1)
        cos = (a * b).sum(axis=1) / np.maximum(na * nb, 1e-12)
        result.cosine = float(cos.mean())
    classes = output_is_logits(original) and a.ndim == 2 and a.shape[1] > 1
    if classes:
        result.agreement = float((a.argmax(1) == b.argmax(1)).mean())
        if labels is not None and labels.dtype.kind in "iu" and labels.ndim == 1:
            result.accuracy_before = float((a.argmax(1) == labels).mean())
            result.accuracy_after = float((b.argmax(1) == labels).mean())
    return result
