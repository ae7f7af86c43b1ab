"""Distillation: width-reduced students, hidden-state matching, the student file interface."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_models import depthwise_cnn, residual_cnn, token_batch, transformer_block

from modelpress.compress.distill import distill
from modelpress.compress.distill.features import fit_projections, match, stage_outputs
from modelpress.compress.prune.api import prune
from modelpress.compress.prune.depgraph import probe_shapes
from modelpress.compress.train import FeaturePair, Objective, TrainConfig, TrainData, fit
from modelpress.compress.train import module as modules
from modelpress.errors import InputError, OptionError


def test_width_student_trains(rng):
    teacher = residual_cnn()
    data = {"x": rng.standard_normal((48, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 4, 48)}
    r = distill(
        teacher,
        data=data,
        labels_key="y",
        width=0.5,
        train=TrainConfig(steps=6, batch_size=16, lr=1e-2),
    )
    assert r.student == "width 0.5" and r.params_student < 0.6 * r.params_teacher
    assert r.training.steps == 6 and r.check.accuracy_after is not None
    assert len(r.features) == 1  # the residual block's output, by name


def test_hidden_states_matched(rng):
    teacher = transformer_block()
    x = token_batch(rng)
    pairs = match(teacher, teacher, probe_shapes(teacher, x), probe_shapes(teacher, x))
    assert len(pairs) == 2 and all(p.student == p.teacher and p.projection is None for p in pairs)
    r = distill(
        teacher,
        data={"x": rng.standard_normal((16, 5, 16)).astype(np.float32)},
        width=0.5,
        train=TrainConfig(steps=2, batch_size=8),
    )
    assert len(r.features) == 2 and r.check.cosine is not None


def test_student_interface_checked(rng):
    with pytest.raises(InputError, match="rank"):
        distill(
            residual_cnn(),
            data={"x": np.zeros((4, 3, 8, 8), np.float32)},
            student=transformer_block(),
        )
    with pytest.raises(OptionError, match="student"):
        distill(residual_cnn(), data={"x": np.zeros((4, 3, 8, 8), np.float32)})


def _names(values):
    return [v.name for v in values]


def test_cnn_stage_outputs():
    # a residual block's output is a stage end; the stem's map, which the block's Add still
    # reads, and the values inside the block are not
    cnn = residual_cnn()
    x = {"x": np.zeros((2, 3, 8, 8), np.float32)}
    assert _names(stage_outputs(cnn, probe_shapes(cnn, x))) == [cnn.graph.node(-4).outputs[0].name]
    assert (
        cnn.graph.node(-4).op_type == "Relu"
        and cnn.graph.node(-4).inputs[0].producer().op_type == "Add"
    )
    # two resolutions: the last 8x8 map before the MaxPool, then the pooled 4x4 map
    dw = depthwise_cnn()
    stages = stage_outputs(dw, probe_shapes(dw, x))
    assert [v.producer().op_type for v in stages] == ["Relu", "MaxPool"]
    assert stages[0].consumers()[0].op_type == "MaxPool"


def test_cnn_features_matched_on_width_student(rng):
    teacher = residual_cnn()
    x = {"x": rng.standard_normal((16, 3, 8, 8)).astype(np.float32)}
    student = prune(teacher, data=x, ratio=0.5, train=False).model
    shapes_t, shapes_s = probe_shapes(teacher, x), probe_shapes(student, x)
    pairs = match(teacher, student, shapes_t, shapes_s)
    assert len(pairs) == 1 and pairs[0].student == pairs[0].teacher
    name = pairs[0].student
    assert shapes_t[name] == (16, 8, 8, 8) and shapes_s[name] == (16, 4, 8, 8)
    proj = pairs[0].projection
    assert proj.weight.shape == (8, 4, 1, 1)
    assert proj(torch.zeros(shapes_s[name])).shape == shapes_t[name]


def test_projection_is_least_squares(rng):
    # teacher maps that are an exact linear function of the student's channels: the fitted 1x1
    # projection recovers it. The ridge (1e-3 of the mean channel energy) moves a solution on
    # unit-variance, nearly orthogonal channels by about 1e-3 of itself, hence rtol 3e-3.
    s = rng.standard_normal((64, 4, 6, 6))
    w = rng.standard_normal((8, 4))
    t = np.einsum("oc,nchw->nohw", w, s)
    pair = FeaturePair("s", "t", torch.nn.Conv2d(4, 8, 1, bias=False))
    fit_projections([pair], [torch.from_numpy(s).float()], [torch.from_numpy(t).float()])
    np.testing.assert_allclose(
        pair.projection.weight.detach().numpy()[:, :, 0, 0], w, rtol=3e-3, atol=3e-3
    )


def test_feature_loss_trains_the_student(rng):
    # the feature term alone (no outputs, no labels): training the width-reduced student lowers
    # the held-out distance of its stage output, through the projection, to the teacher's
    # (to about 0.5-0.65 of the start over seeds; frozen weights keep it where it was)
    torch.manual_seed(0)  # the projection's initial weights
    teacher = residual_cnn()
    x = {"x": rng.standard_normal((64, 3, 8, 8)).astype(np.float32)}
    student = prune(teacher, data=x, ratio=0.5, train=False).model
    pairs = match(teacher, student, probe_shapes(teacher, x), probe_shapes(student, x))
    frozen = modules.teacher(teacher, features=[p.teacher for p in pairs])
    learner = modules.trainable(student, features=[p.student for p in pairs])
    objective = Objective(outputs=1, teacher=frozen, features=pairs)
    data = TrainData.load(x, teacher)
    r = fit(learner, data, objective, TrainConfig(steps=60, batch_size=16, lr=1e-2))
    assert r.first_loss > 0 and r.final_loss < 0.75 * r.first_loss


def test_distill_matches_cnn_stages(rng):
    teacher = residual_cnn()
    data = {"x": rng.standard_normal((64, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 4, 64)}
    r = distill(
        teacher,
        data=data,
        labels_key="y",
        width=0.5,
        train=TrainConfig(steps=12, batch_size=16, lr=1e-2),
    )
    relu = teacher.graph.node(-4).outputs[0].name
    assert r.features == [(relu, relu)]
    assert r.training.final_loss < r.training.first_loss
