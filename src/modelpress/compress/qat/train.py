"""The QAT training run: calibration batches as training data, the float model as teacher."""

from __future__ import annotations

import onnx_ir as ir

from modelpress.compress.qat.fakequant import TrainingGraph
from modelpress.compress.train import (
    TrainConfig,
    TrainData,
    TrainResult,
    build_objective,
    fit,
    teacher,
)
from modelpress.errors import InputError

DEFAULT_TRAINING = TrainConfig(epochs=2, lr=1e-4)


def calibration_data(cal, model: ir.Model) -> TrainData:
    """The calibration set's batches (and labels) as training data."""
    items = [(b.feeds, b.labels) for b in cal.batches(model)]
    if not items:
        raise InputError(f"{cal.name}: the training set is empty")
    return TrainData.load(items, model)


def train_qdq(
    float_model: ir.Model, qdq: ir.Model, cal, opt, progress
) -> tuple[ir.Model, TrainResult]:
    """``qdq`` (static mode's graph of ``float_model``) trained with fake quantization."""
    config = opt.train if isinstance(opt.train, TrainConfig) else DEFAULT_TRAINING
    data = calibration_data(cal, float_model)
    graph = TrainingGraph(qdq, bits=opt.bits)
    module = graph.module()
    objective = build_objective(float_model, labels=data.has_labels, teacher=teacher(float_model))
    report = None
    if progress is not None:
        report = lambda step, total, loss: progress(step, total)  # noqa: E731 (calibration's bar)
    result = fit(module, data, objective, config, progress=report)
    return graph.export(module, pair_safe=opt.pair_safe), result
