"""ONNX's reference evaluator on an in-memory model: slow, but it has every standard op, so it
evaluates what ONNX Runtime's kernels lack (a type, an old op form) when folding constants."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def evaluate(model: ir.Model, feeds: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """The model's outputs, in order, computed by ``onnx.reference``."""
    from onnx.reference import ReferenceEvaluator  # a large import, needed rarely

    return list(ReferenceEvaluator(ir.serde.serialize_model(model)).run(None, feeds or {}))
