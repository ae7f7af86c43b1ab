"""QAT: static mode's QDQ structure, the export matching the fake-quantized module, the mode."""

from __future__ import annotations

import numpy as np
import torch
from train_models import image_batch, residual_cnn

from modelpress.compress.qat.fakequant import TrainingGraph
from modelpress.compress.quantize import quantize
from modelpress.compress.train import TrainConfig, TrainData, build_objective, fit, teacher
from modelpress.ir.match import const_array
from modelpress.verify import run_model


def _calib(rng, n=4):
    return [{"x": rng.standard_normal((8, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def _structure(model):
    return [
        (
            n.op_type,
            [
                str(const_array(v).dtype) if v is not None and const_array(v) is not None else "-"
                for v in n.inputs
            ],
        )
        for n in model.graph
    ]


def test_qat_mode_writes_static_structure(rng):
    model = residual_cnn()
    cal = _calib(rng)
    static = quantize(
        model, mode="static", data=cal, target_cpu="vnni", gptq=False, bias_correction=False
    )
    qat = quantize(
        model,
        mode="qat",
        data=cal,
        target_cpu="vnni",
        train=TrainConfig(steps=3, batch_size=8, lr=1e-3, val_fraction=0),
    )
    assert _structure(qat.model) == _structure(static.model)
    assert any("quantization-aware training: 3 steps" in n for n in qat.notes)
    x = image_batch(rng)
    moved = run_model(qat.model, x)["y"] - run_model(static.model, x)["y"]
    assert np.abs(moved).max() > 0  # trained: codes and scales moved


def test_export_matches_fake_quantized_module(rng):
    model = residual_cnn()
    cal = _calib(rng)
    static = quantize(
        model, mode="static", data=cal, target_cpu="vnni", gptq=False, bias_correction=False
    )
    tg = TrainingGraph(static.model)
    module = tg.module()
    x = image_batch(rng)
    # untrained, the fake-quantized module computes what static mode's graph computes
    with torch.no_grad():
        before = module(torch.from_numpy(x["x"])).numpy()
    np.testing.assert_allclose(before, run_model(static.model, x)["y"], rtol=0, atol=1e-4)
    data = TrainData.load([({"x": c["x"]}, None) for c in cal], model)
    objective = build_objective(model, labels=False, teacher=teacher(model))
    fit(module, data, objective, TrainConfig(steps=4, batch_size=8, lr=1e-3, val_fraction=0))
    exported = tg.export(module)
    with torch.no_grad():
        after = module(torch.from_numpy(x["x"])).numpy()
    assert not np.allclose(after, before, atol=1e-4)
    # the module rounds its biases on the int32 grid scale_x·scale_w as the export does: without
    # that, a bias half a step off moved outputs on a rounding boundary by a whole step (3e-3 here)
    np.testing.assert_allclose(run_model(exported, x)["y"], after, rtol=0, atol=1e-4)
    assert _structure(exported) == _structure(static.model)
