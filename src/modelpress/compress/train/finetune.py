"""``finetune``: train an ONNX model on data, with labels, against a teacher model, or both.

The common path of every method that trains: build the trainable module (``prepare`` may then
reparametrize its weights: masks, shared codebooks, fake quantization), choose the objective
(labels → hard loss; ``teacher`` → soft loss on its outputs; both → their mix), run ``fit``, and
write the trained weights back into the model.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
from torch import nn

from modelpress.compress.train import module as modules
from modelpress.compress.train.data import TrainData
from modelpress.compress.train.loop import Progress, TrainConfig, TrainResult, fit
from modelpress.compress.train.objective import build_objective


def finetune(
    model: ir.Model,
    data: TrainData,
    *,
    teacher: ir.Model | None,
    config: TrainConfig,
    soft: str = "auto",
    alpha: float | None = None,
    temperature: float = 1.0,
    prepare: Callable[[nn.Module], list[nn.Parameter] | None] | None = None,
    after_step: Callable[[nn.Module], None] | None = None,
    progress: Progress | None = None,
    held_out: TrainData | None = None,
) -> tuple[ir.Model, TrainResult]:
    """``model`` trained on ``data``; returns the trained model and the loss curve.

    ``prepare(module)`` runs before training and may return the parameters to train (default:
    all of the module's); ``after_step(module)`` runs after every optimizer step. ``held_out``: the
    samples for early stopping (default: ``config.val_fraction`` of ``data``).
    """
    student = modules.trainable(model)
    params = prepare(student) if prepare is not None else None
    frozen = modules.teacher(teacher) if teacher is not None else None
    objective = build_objective(
        model,
        labels=data.has_labels,
        teacher=frozen,
        soft=soft,
        alpha=alpha,
        temperature=temperature,
    )
    hook = (lambda: after_step(student)) if after_step is not None else None
    result = fit(
        student,
        data,
        objective,
        config,
        params=params,
        held_out=held_out,
        after_step=hook,
        progress=progress,
    )
    return modules.export(student, model), result
