"""``distill()``: train a smaller student to compute what a teacher model computes.

The student is a model file (same inputs and outputs as the teacher), or is made from the teacher
by structured width reduction (``width=0.5``: half the channels, FFN neurons and attention heads
of every prunable group removed by ``prune``, L1 importance, BatchNorm statistics measured again),
so it starts from the teacher's own weights. It is trained with the soft loss against the
teacher's outputs at temperature T (KL for class scores), plus the hard loss when the data has
labels (``alpha`` weighs them), plus the mean squared error between matched intermediate values
(``features``: transformer hidden states, or a CNN's stage outputs; see ``features.py``). The
result is checked against the teacher on the held-out samples.

The default of 10 epochs, and why, is in ``docs/defaults.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir
import torch

from modelpress.compress.distill import features as feats
from modelpress.compress.prune.api import param_count, prune
from modelpress.compress.prune.depgraph import probe_shapes
from modelpress.compress.train import (
    TeacherLoss,
    TrainConfig,
    TrainData,
    TrainResult,
    build_objective,
    fit,
)
from modelpress.compress.train import module as modules
from modelpress.compress.train.batchnorm import recalibrate
from modelpress.compress.train.loop import to_tensors
from modelpress.compress.train.results import result_dict
from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import as_model
from modelpress.ir.io import model_bytes
from modelpress.verify.metrics import Comparison, compare

Progress = Callable[[str, int, int, float | None], None]
DEFAULT_TRAINING = TrainConfig(epochs=10, lr=3e-3)


@dataclass
class DistillResult:
    model: ir.Model
    student: str  # "file" or "width 0.5"
    params_teacher: int
    params_student: int
    size_teacher: int
    size_student: int
    seconds: float
    features: list[tuple[str, str]] = field(default_factory=list)
    training: TrainResult | None = None
    check: Comparison | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return result_dict(self)


def _check_interface(teacher: ir.Model, student: ir.Model) -> None:
    ti = [v.name for v in teacher.graph.inputs if v.name not in teacher.graph.initializers]
    si = [v.name for v in student.graph.inputs if v.name not in student.graph.initializers]
    if sorted(ti) != sorted(si):
        raise InputError(
            f"the student's inputs ({', '.join(si)}) are not the teacher's ({', '.join(ti)})"
        )
    if len(teacher.graph.outputs) != len(student.graph.outputs):
        raise InputError(
            f"the student has {len(student.graph.outputs)} outputs, the teacher {len(teacher.graph.outputs)}"
        )


def _fit_projections(
    pairs, learner, frozen, data: TrainData, outputs: int, samples: int = 256
) -> None:
    """Least-squares projections from the student's features as it computes them in training
    (BatchNorm on the batch's statistics: a student that starts from random weights has no
    running statistics worth the name), its BatchNorm statistics left as they were."""
    feeds = to_tensors(next(data.batches(samples)).feeds, "cpu")
    state = {k: v.clone() for k, v in learner.state_dict().items()}
    with torch.no_grad():
        s, t = learner(**feeds), frozen(**feeds)
    learner.load_state_dict(state)
    feats.fit_projections(pairs, s[outputs:], t[outputs:])


def distill(
    teacher,
    *,
    data,
    student=None,
    width: float | None = None,
    labels_key: str | None = None,
    image=None,
    limit: int | None = None,
    temperature: float = 4.0,
    alpha: float | None = None,
    soft: str = "auto",
    features: str = "auto",
    feature_weight: float = 1.0,
    train: TrainConfig | None = None,
    progress: Progress | None = None,
) -> DistillResult:
    """Distill ``teacher`` into ``student`` (a model or path) or into its ``width`` reduction."""
    started = time.perf_counter()
    t_model = as_model(teacher)
    if (student is None) == (width is None):
        raise OptionError(
            "give the student: a model file, or a width to reduce the teacher to (e.g. 0.5)"
        )
    if features not in ("auto", "none"):
        raise OptionError(f"features {features!r}: choose auto or none")
    config = train or DEFAULT_TRAINING
    dataset = TrainData.load(data, t_model, labels_key=labels_key, image=image, limit=limit)
    train_part, held = dataset.split(config.val_fraction, seed=config.seed)
    notes: list[str] = []
    if student is not None:
        s_model = as_model(student)
        _check_interface(t_model, s_model)
        dataset.check(s_model)  # the same data must fit the student's inputs
        origin = "file"
    else:
        if not 0 < width < 1:
            raise OptionError(f"width {width}: choose a fraction in (0, 1)")
        if progress:
            progress("making the student", 0, 0, None)
        reduced = prune(
            t_model, data=train_part, ratio=1 - width, head_ratio=1 - width, train=False
        )
        s_model = reduced.model
        recalibrate(s_model, train_part)
        origin = f"width {width:g}"
        notes += reduced.notes
    sample = dataset.sample(2)
    pairs = []
    if features == "auto":
        pairs = feats.match(
            t_model, s_model, probe_shapes(t_model, sample), probe_shapes(s_model, sample)
        )
    frozen = modules.teacher(t_model, features=[p.teacher for p in pairs])
    learner = modules.trainable(s_model, features=[p.student for p in pairs])
    if any(p.projection is not None for p in pairs):
        _fit_projections(pairs, learner, frozen, train_part, len(t_model.graph.outputs))
    objective = build_objective(
        s_model,
        labels=dataset.has_labels,
        teacher=frozen,
        loss=TeacherLoss(soft=soft, alpha=alpha, temperature=temperature),
        features=pairs,
        feature_weight=feature_weight,
    )
    report = (
        None
        if progress is None
        else (lambda step, total, loss: progress("distilling", step, total, loss))
    )
    result = fit(learner, train_part, objective, config, held_out=held, progress=report)
    trained = modules.export(learner, s_model)
    return DistillResult(
        model=trained,
        student=origin,
        params_teacher=param_count(t_model),
        params_student=param_count(trained),
        size_teacher=len(model_bytes(t_model)),
        size_student=len(model_bytes(trained)),
        seconds=time.perf_counter() - started,
        features=[(p.student, p.teacher) for p in pairs],
        training=result,
        check=compare(t_model, trained, held if held is not None else dataset),
        notes=notes,
    )
