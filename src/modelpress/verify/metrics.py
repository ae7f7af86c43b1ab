"""How far one model's outputs are from another's, and from the labels: the metrics every command
reports (``quantize``, ``prune``, ``distill``, ``compress``, ``auto``, the demo).

Outputs are compared sample by sample: an array's axis 0 is the sample, the rest is flattened.

- ``accuracy``: top-1 accuracy, the argmax of the class scores against integer labels;
- ``agreement``: top-1 agreement of two models' class scores (the original counts as the labels);
- ``cosine``: the cosine similarity of each sample's outputs (two zero vectors agree: 1; a zero
  and a nonzero vector do not: 0); ``mean_cosine`` averages it;
- ``mse``: the mean squared difference;
- ``sqnr_db`` and ``relative_error``: the signal-to-quantization-noise ratio in dB and
  ``sqrt(error / signal)`` from the summed energies of a signal and of its error.

``compare(original, candidate, data)`` runs both models under ONNX Runtime (optimizations off) on
every batch of ``data`` and reports the top-1 accuracies (with labels), the agreement (class
scores) and the mean cosine (any float output) of the first output, as a ``Comparison``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.runtime.ort import session


def _rows(x) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(len(x), -1) if x.ndim else x.reshape(1, 1)


def top1_hits(scores, labels) -> int:
    """How many samples' argmax over the class scores equals their label."""
    labels = np.asarray(labels).reshape(-1)
    return int((_rows(scores).reshape(len(labels), -1).argmax(axis=-1) == labels).sum())


def accuracy(scores, labels) -> float:
    """Top-1 accuracy of ``scores`` (samples × classes) against integer ``labels``."""
    n = np.asarray(labels).size
    return top1_hits(scores, labels) / n if n else 0.0


def agreement(a, b) -> float:
    """The share of samples whose argmax is the same in ``a`` and ``b``."""
    a, b = _rows(a), _rows(b)
    return float((a.argmax(axis=1) == b.argmax(axis=1)).mean()) if len(a) else 0.0


def cosine(a, b) -> np.ndarray:
    """The cosine similarity of each sample (row) of ``a`` with the same sample of ``b``."""
    a, b = _rows(a).astype(np.float64), _rows(b).astype(np.float64)
    num = np.sum(a * b, axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    # two zero vectors agree; a zero and a nonzero vector do not
    same_zero = (np.abs(a).sum(axis=1) == np.abs(b).sum(axis=1)) * 1.0
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), same_zero)


def mean_cosine(a, b) -> float:
    return float(cosine(a, b).mean())


def mse(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.mean((a - b) ** 2))


def sqnr_db(signal: float, error: float) -> float:
    """``10·log10(signal / error)`` from summed squared energies; infinite for no error, minus
    infinity for no signal or an error that is not finite (a constant out of a 16-bit range)."""
    if error == 0:
        return math.inf
    return 10 * math.log10(signal / error) if signal > 0 and math.isfinite(error) else -math.inf


def relative_error(signal: float, error: float) -> float:
    """``sqrt(error / signal)`` from summed squared energies."""
    if signal > 0:
        return math.sqrt(error / signal)
    return 0.0 if error == 0 else math.inf


def output_is_logits(model: ir.Model, index: int = 0) -> bool:
    """True when output ``index`` is 2-D class scores: made by Gemm, or MatMul plus a bias."""
    value = model.graph.outputs[index]
    if value.shape is not None and len(value.shape) != 2:
        return False
    node = value.producer()
    hops = 0
    while (
        node is not None and node.op_type in ("Add", "Identity", "Flatten", "Reshape") and hops < 3
    ):
        # a bias Add or a reshape after the product; follow the non-constant operand
        nxt = [
            v
            for v in node.inputs
            if v is not None and v.const_value is None and v.producer() is not None
        ]
        node = nxt[0].producer() if nxt else None
        hops += 1
    return node is not None and node.op_type in ("Gemm", "MatMul")


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


def first_outputs(model: ir.Model, data, *, batch_size: int = 64):
    """The first output of ``model`` on every batch of ``data`` (anything whose
    ``batches(batch_size)`` yields batches with ``feeds`` and ``labels``), one row a sample, and
    the labels, in data order."""
    sess = session(model, optimize="disabled")
    name = sess.get_outputs()[0].name
    outs, labels = [], []
    for batch in data.batches(batch_size):
        outs.append(sess.run([name], batch.feeds)[0])
        if batch.labels is not None:
            labels.append(batch.labels)
    flat = [o.reshape(o.shape[0], -1) for o in outs]
    return np.concatenate(flat), (np.concatenate(labels) if labels else None)


def compare(original: ir.Model, candidate: ir.Model, data, *, batch_size: int = 64) -> Comparison:
    """``candidate`` against ``original`` on ``data`` (see the module docstring)."""
    a, labels = first_outputs(original, data, batch_size=batch_size)
    b, _ = first_outputs(candidate, data, batch_size=batch_size)
    result = Comparison(samples=len(a))
    if a.dtype.kind == "f":
        result.cosine = mean_cosine(a, b)
    if output_is_logits(original) and a.ndim == 2 and a.shape[1] > 1:
        result.agreement = agreement(a, b)
        if labels is not None and labels.dtype.kind in "iu" and labels.ndim == 1:
            result.accuracy_before = accuracy(a, labels)
            result.accuracy_after = accuracy(b, labels)
    return result


__all__ = [
    "Comparison",
    "accuracy",
    "agreement",
    "compare",
    "cosine",
    "first_outputs",
    "mean_cosine",
    "mse",
    "output_is_logits",
    "relative_error",
    "sqnr_db",
    "top1_hits",
]
