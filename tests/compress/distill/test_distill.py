"""Distillation: width-reduced students, hidden-state matching, the student file interface."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import residual_cnn, token_batch, transformer_block

from modelpress.compress.distill import distill
from modelpress.compress.distill.features import match
from modelpress.compress.prune.depgraph import probe_shapes
from modelpress.compress.train import TrainConfig
from modelpress.errors import InputError, OptionError


def test_width_student_trains(rng):
    teacher = residual_cnn()
    data = {"x": rng.standard_normal((48, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 4, 48)}
    r = distill(teacher, data=data, labels_key="y", width=0.5, train=TrainConfig(steps=6, batch_size=16, lr=1e-2))
    assert r.student == "width 0.5" and r.params_student < 0.6 * r.params_teacher
    assert r.training.steps == 6 and r.check.accuracy_after is not None
    assert r.features == []  # no transformer hidden states in a CNN


def test_hidden_states_matched(rng):
    teacher = transformer_block()
    x = token_batch(rng)
    pairs = match(teacher, teacher, probe_shapes(teacher, x), probe_shapes(teacher, x))
    assert len(pairs) == 2 and all(p.student == p.teacher and p.projection is None for p in pairs)
    r = distill(teacher, data={"x": rng.standard_normal((16, 5, 16)).astype(np.float32)}, width=0.5, train=TrainConfig(steps=2, batch_size=8))
    assert len(r.features) == 2 and r.check.cosine is not None


def test_student_interface_checked(rng):
    with pytest.raises(InputError, match="rank"):
        distill(residual_cnn(), data={"x": np.zeros((4, 3, 8, 8), np.float32)}, student=transformer_block())
    with pytest.raises(OptionError, match="student"):
        distill(residual_cnn(), data={"x": np.zeros((4, 3, 8, 8), np.float32)})
