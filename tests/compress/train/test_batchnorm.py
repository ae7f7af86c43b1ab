"""BatchNorm statistics measured again: each node's mean and variance are those of its input on
the data, with the nodes before it already updated."""

from __future__ import annotations

import numpy as np
from train_models import residual_cnn

from modelpress.compress.train import TrainData
from modelpress.compress.train.batchnorm import recalibrate
from modelpress.ir.graph import copy_model
from modelpress.ir.match import const_array
from modelpress.verify import run_model


def test_statistics_are_those_of_the_inputs(rng):
    model = copy_model(residual_cnn())
    x = (rng.standard_normal((32, 3, 8, 8)) * 2 + 0.5).astype(np.float32)
    data = TrainData.load({"x": x}, model)
    assert recalibrate(model, data, batches=4, batch_size=8) == 3
    probe = copy_model(model)
    bns = [n for n in probe.graph if n.op_type == "BatchNormalization"]
    for n in bns:
        probe.graph.outputs.append(n.inputs[0])
    outs = run_model(probe, {"x": x})
    for n in bns:
        got = outs[n.inputs[0].name].astype(np.float64)
        mean = got.mean(axis=(0, 2, 3))
        var = got.var(axis=(0, 2, 3))
        np.testing.assert_allclose(const_array(n.inputs[3]), mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(const_array(n.inputs[4]), var, rtol=1e-4, atol=1e-5)
