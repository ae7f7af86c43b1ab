"""Importance scores against references: the activation criterion against its formula computed by
hand on the model's own intermediate values, and its indifference to BatchNorm folding."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import depthwise_cnn, image_batch, residual_cnn

from modelpress.compress.prune import importance
from modelpress.compress.prune.analyzer import analyze
from modelpress.compress.prune.depgraph import probe_shapes
from modelpress.errors import OptionError
from modelpress.ir.graph import copy_model
from modelpress.ir.match import const_array, values_by_name
from modelpress.passes.fuse_conv_bn import FuseConvBatchNorm
from modelpress.verify import run_model


def _scores(model, batches, method):
    dg = analyze(copy_model(model), probe_shapes(model, batches[0]))
    acts = importance.input_rms(dg, batches) if method == "activation" else None
    scores = importance.scores(dg, method, activations=acts)
    # by the group's source layers, in unit order: comparable across two versions of one network
    return {tuple(g.sources): [scores[c] for c in g.components] for g in dg.groups if g.components}


def _value(model, name, feeds):
    m = copy_model(model)
    m.graph.outputs.append(values_by_name(m.graph)[name])
    return run_model(m, feeds)[name]


def test_activation_is_weight_columns_times_input_rms(rng):
    # residual_cnn's inner block: conv(8→6)-BN-Relu, read by one conv(6→8) and its BN (scale s):
    # a channel's score is sum_o |s_o · W[o, c]| · sqrt(mean of the Relu output's channel c squared
    # over batch and pixels)
    model = residual_cnn()
    batches = [image_batch(rng), image_batch(rng)]
    reader = next(
        n
        for n in model.graph
        if n.op_type == "Conv" and const_array(n.inputs[1]).shape[:2] == (8, 6)
    )
    h = np.concatenate([_value(model, reader.inputs[0].name, b) for b in batches]).astype(
        np.float64
    )
    rms = np.sqrt((h**2).mean(axis=(0, 2, 3)))
    bn = reader.outputs[0].uses()[0].node
    gamma, var = (const_array(bn.inputs[i]).astype(np.float64) for i in (1, 4))
    s = gamma / np.sqrt(var + 1e-5)
    w = const_array(reader.inputs[1]).astype(np.float64) * s[:, None, None, None]
    expected = np.abs(w).sum(axis=(0, 2, 3)) * rms
    inner = [v for v in _scores(model, batches, "activation").values() if len(v) == 6]
    assert len(inner) == 1
    np.testing.assert_allclose(inner[0], expected, rtol=1e-6)


@pytest.mark.parametrize("build", [residual_cnn, depthwise_cnn])
def test_activation_scores_do_not_change_when_batchnorm_is_folded(build, rng):
    model = build()
    folded = FuseConvBatchNorm()(copy_model(model)).model
    assert sum(n.op_type == "BatchNormalization" for n in folded.graph) == 0
    batches = [image_batch(rng)]
    plain, fused = _scores(model, batches, "activation"), _scores(folded, batches, "activation")
    assert plain.keys() == fused.keys() and plain
    for key in plain:
        # float32 outputs of two differently ordered computations
        np.testing.assert_allclose(fused[key], plain[key], rtol=1e-5)
    # the filters' own magnitudes do change: l1 ranks the folded model differently
    l1_plain, l1_fused = _scores(model, batches, "l1"), _scores(folded, batches, "l1")
    assert any(not np.allclose(l1_plain[k], l1_fused[k], rtol=1e-3) for k in l1_plain)


def test_activation_needs_its_measurements(rng):
    model = residual_cnn()
    dg = analyze(copy_model(model), probe_shapes(model, image_batch(rng)))
    with pytest.raises(OptionError, match="sample inputs"):
        importance.scores(dg, "activation")
