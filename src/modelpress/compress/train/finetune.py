"""``finetune``: train an ONNX model on data, with labels, against a teacher model, or both.

The common path of every method that trains: build the trainable module (``prepare`` may then
reparametrize its weights: masks, shared codebooks, fake quantization), choose the objective
(labels → hard loss; ``teacher`` → soft loss on its outputs; both → their mix), run ``fit``, and
write the trained weights back into the model.

The loop keeps the weights of its best held-out loss, but that loss is measured in PyTorch on the
training objective. What counts is the model as it will run: both the model before training and
the trained one are run with ONNX Runtime on the held-out samples (``metrics.compare`` against
the teacher, else against the model before training) and judged by the budget's measure
(``budget.score``). When training made it worse, the model before training is returned and the
result says so (``fell_back``): on real data a learning rate or a soft loss that does not suit
the model must not hand back a model worse than no training.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
from torch import nn

from modelpress.compress.train import module as modules
from modelpress.compress.train.budget import score
from modelpress.compress.train.data import TrainData
from modelpress.compress.train.loop import Progress, TrainConfig, TrainResult, fit
from modelpress.compress.train.objective import TeacherLoss, build_objective
from modelpress.verify.metrics import compare


def teacher_objective(
    model: ir.Model,
    data: TrainData,
    teacher: ir.Model | None,
    *,
    loss: TeacherLoss | None = None,
):
    """What ``model`` learns on ``data``: its labels, the outputs of ``teacher`` (run frozen), or
    both mixed by ``loss`` (``build_objective``)."""
    frozen = modules.teacher(teacher) if teacher is not None else None
    return build_objective(model, labels=data.has_labels, teacher=frozen, loss=loss)


def finetune(
    model: ir.Model,
    data: TrainData,
    *,
    teacher: ir.Model | None,
    config: TrainConfig,
    loss: TeacherLoss | None = None,
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
    if held_out is None:
        data, held_out = data.split(config.val_fraction, seed=config.seed)
    student = modules.trainable(model)
    params = prepare(student) if prepare is not None else None
    objective = teacher_objective(model, data, teacher, loss=loss)
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
    trained = modules.export(student, model)
    if held_out is None or result.steps == 0:
        return trained, result
    reference = teacher if teacher is not None else model
    before = score(compare(reference, model, held_out))
    after = score(compare(reference, trained, held_out))
    result.score_before, result.score_after = before, after
    if before is not None and after is not None and after < before:
        result.fell_back = True
        return model, result
    return trained, result
