"""How a candidate is scored: the metric, on the user's data, against the original model.

A score is higher-is-better; the *drop* of a candidate is the original's score minus its own, in
the metric's units, the quantity ``--max-accuracy-drop`` bounds (as in ``quantize``: 0.01 is one
point of top-1 accuracy).

- ``top1``: accuracy of the first output's argmax against the labels (``labels_key``);
- ``cosine``: mean cosine similarity, sample by sample, between the candidate's float outputs and
  the original's (all float outputs of a sample, flattened together); the original scores 1;
- ``mse``: mean squared difference from the original's float outputs, as a negative score (the
  drop is the MSE itself);
- a Python callable ``metric(run) -> float`` (higher is better), where ``run(feeds)`` returns the
  model's outputs by name, the contract of ``quantize(metric=...)``.

Candidates run as they will be deployed: ONNX Runtime with its graph optimizations on. A model
ONNX Runtime's CPU cannot run (bfloat16) runs on the PyTorch backend where it is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, ModelLoadError, OptionError
from modelpress.runtime import ort as mp_ort
from modelpress.runtime.session import Session
from modelpress.verify.metrics import cosine, top1_hits

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
METRICS = ("cosine", "mse", "top1")


def runner(model: ir.Model) -> Run:
    """``feeds → outputs`` for ``model`` under ONNX Runtime (optimizations on), or on the PyTorch
    backend when ONNX Runtime's CPU has no kernel for it and torch is installed."""

    try:
        sess = mp_ort.session(model, optimize="all")
    except ModelLoadError:
        return _torch_runner(model)
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = sess.run(names, {k: v for k, v in feeds.items() if k in inputs})
        return dict(zip(names, values, strict=True))

    return run


def _torch_runner(model: ir.Model) -> Run:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ModelLoadError(
            "ONNX Runtime's CPU cannot run this candidate and the PyTorch backend (the torch extra) is not installed"
        )

    sess = Session(model, backend="torch", device="cpu")
    inputs = set(sess.input_names)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = sess.run({k: v for k, v in feeds.items() if k in inputs}, check=False)
        return {k: np.asarray(v) for k, v in out.items()}

    return run


@dataclass
class EvalData:
    """The scoring samples, in batches, with their labels (top-1) when there are any."""

    batches: list[dict[str, np.ndarray]]
    labels: list[np.ndarray] | None
    samples: int


def eval_data(
    arrays: dict[str, np.ndarray],
    input_names: list[str],
    *,
    labels_key: str | None,
    start: int = 0,
    batch_size: int = 32,
    source: str = "--data",
) -> EvalData:
    """Batches of ``arrays[start:]`` (only the model's inputs), and the labels, if asked for."""
    missing = [n for n in input_names if n not in arrays]
    if missing:
        raise InputError(
            f"{source}: no array named {missing[0]!r} (arrays: {', '.join(arrays)}; the model's inputs: {', '.join(input_names)})"
        )
    if labels_key is not None and labels_key not in arrays:
        raise InputError(
            f"{source}: no array named {labels_key!r} (the labels key); arrays: {', '.join(arrays)}"
        )
    n = min(arrays[name].shape[0] for name in input_names)
    if n - start < 1:
        raise InputError(f"{source}: no samples left to score on")
    batches, labels = [], [] if labels_key else None
    for i in range(start, n, batch_size):
        batches.append({k: arrays[k][i : i + batch_size] for k in input_names})
        if labels is not None:
            labels.append(np.asarray(arrays[labels_key][i : i + batch_size]))
    return EvalData(batches, labels, n - start)


def _float_outputs(out: dict[str, np.ndarray]) -> np.ndarray:
    parts = [
        np.asarray(v, dtype=np.float64).reshape(len(v), -1)
        for v in out.values()
        if np.issubdtype(np.asarray(v).dtype, np.floating) and np.ndim(v) >= 1
    ]
    if not parts:
        raise InputError(
            "the model has no float output to compare (use `metric` top1 or a metric function)"
        )
    return np.concatenate(parts, axis=1)


class Scorer:
    """Scores candidates on ``data`` with ``metric``, against the reference model's outputs."""

    def __init__(self, reference: ir.Model, data: EvalData, metric: str | Callable):
        if isinstance(metric, str) and metric not in METRICS:
            raise OptionError(f"`metric` {metric}: choose one of {', '.join(METRICS)}")
        if metric == "top1" and data.labels is None:
            raise OptionError("`metric` top1 needs labels: give `labels_key`")
        self.metric = metric
        self.data = data
        run = runner(reference)
        self._reference: list[np.ndarray] = []
        if metric in ("cosine", "mse"):
            self._reference = [_float_outputs(run(b)) for b in data.batches]
            self.reference_score = 1.0 if metric == "cosine" else 0.0
        else:
            self.reference_score = self.score(run)

    @property
    def name(self) -> str:
        return (
            self.metric
            if isinstance(self.metric, str)
            else getattr(self.metric, "__name__", "metric")
        )

    def score(self, run: Run) -> float:
        if callable(self.metric):
            return float(self.metric(run))
        if self.metric == "top1":
            hits = 0
            for feeds, labels in zip(self.data.batches, self.data.labels or []):
                out = next(iter(run(feeds).values()))
                hits += top1_hits(out, labels)
            return hits / max(self.data.samples, 1)
        total, n = 0.0, 0
        for feeds, ref in zip(self.data.batches, self._reference):
            got = _float_outputs(run(feeds))
            if got.shape != ref.shape:
                raise InputError(f"outputs of shape {got.shape} where the original has {ref.shape}")
            if self.metric == "cosine":
                cos = cosine(got, ref)
                total += float(np.sum(cos))
                n += len(cos)
            else:
                total += float(np.sum((got - ref) ** 2))
                n += got.size
        value = total / max(n, 1)
        if not np.isfinite(value):
            return float("-inf")
        return value if self.metric == "cosine" else -value

    def drop(self, score: float) -> float:
        return self.reference_score - score


__all__ = ["METRICS", "EvalData", "Scorer", "eval_data", "runner"]
