"""The training loop and its data: sources, checks, the loss going down, the export."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_models import image_batch, residual_cnn

from modelpress.compress.train import (
    TrainConfig,
    TrainData,
    build_objective,
    export,
    fit,
    trainable,
)
from modelpress.compress.train.objective import _soft
from modelpress.errors import InputError
from modelpress.verify import run_model


def _task(rng, n=96):
    """A learnable task for residual_cnn: the class is which quarter of the image is brightest."""
    x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
    quarters = np.stack(
        [
            x[:, :, :4, :4].mean((1, 2, 3)),
            x[:, :, :4, 4:].mean((1, 2, 3)),
            x[:, :, 4:, :4].mean((1, 2, 3)),
            x[:, :, 4:, 4:].mean((1, 2, 3)),
        ],
        1,
    )
    return {"x": x, "y": quarters.argmax(1).astype(np.int64)}


def test_sources_npz_dict_iterable_images(tmp_path, rng):
    model = residual_cnn()
    task = _task(rng, 20)
    np.savez(tmp_path / "t.npz", **task)
    a = TrainData.load(tmp_path / "t.npz", model, labels_key="y")
    b = TrainData.load(task, model, labels_key="y")
    c = TrainData.load(
        [({"x": task["x"][:8]}, task["y"][:8]), ({"x": task["x"][8:]}, task["y"][8:])], model
    )
    for d in (a, b, c):
        assert len(d) == 20 and d.has_labels
        seen = np.concatenate([bt.labels for bt in d.batches(6)])
        np.testing.assert_array_equal(np.sort(seen), np.sort(task["y"]))
    # batches of different shapes stay apart (text of varying length)
    from train_models import transformer_block

    tb = transformer_block()
    d = TrainData.load(
        [{"x": rng.standard_normal((2, s, 16)).astype(np.float32)} for s in (3, 5)], tb
    )
    assert len(d.chunks) == 2 and len(d) == 4
    # a folder of images in class subfolders: the class is the subfolder's sorted index
    from PIL import Image

    from modelpress.ir import parse

    gray = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 1, 8, 8] img) => (float[N, 2] y) {
        p = GlobalAveragePool(img)
        y = Flatten(p)
    }""")
    for k, cls in enumerate(["cat", "dog"]):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8), 40 * k + i, np.uint8)).save(
                tmp_path / "imgs" / cls / f"{i}.png"
            )
    d = TrainData.load(tmp_path / "imgs", gray)
    assert d.classes == ["cat", "dog"] and list(d.chunks[0].labels) == [0, 0, 0, 1, 1, 1]
    np.testing.assert_allclose(d.chunks[0].inputs["img"][4, 0, 0, 0], 41 / 255, rtol=1e-6)


@pytest.mark.parametrize(
    "data, key, message",
    [
        ({"x": np.zeros((4, 3, 8, 8), np.float32)}, "y", "no array named 'y'"),
        ({"x": np.zeros((4, 3, 9, 8), np.float32)}, None, "size 9 on axis 2"),
        ({"x": np.zeros((4, 3, 8), np.float32)}, None, "rank 3"),
        ({"x": np.zeros((0, 3, 8, 8), np.float32)}, None, "empty"),
        ([], None, "empty"),
        ({"x": np.full((2, 3, 8, 8), np.nan, np.float32)}, None, "NaN"),
        (
            {"x": np.zeros((4, 3, 8, 8), np.float32), "y": np.zeros(3, np.int64)},
            "y",
            "4 samples but (3,) labels",
        ),
        ({"x": np.zeros((4, 3, 8, 8), np.float64)}, None, "dtype float64"),
    ],
)
def test_bad_data_one_clear_error(data, key, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainData.load(data, residual_cnn(), labels_key=key)


def test_labels_needed():
    with pytest.raises(InputError, match="needs labels"):
        TrainData.load(
            {"x": np.zeros((4, 3, 8, 8), np.float32)}, residual_cnn(), require_labels=True
        )
    with pytest.raises(InputError, match="labels or a teacher"):
        build_objective(residual_cnn(), labels=False, teacher=None)


def test_fine_tuning_lowers_the_loss_and_exports_what_it_trained(rng):
    model = residual_cnn()
    data = TrainData.load(_task(rng), model, labels_key="y")
    module = trainable(model)
    objective = build_objective(model, labels=True, teacher=None)
    result = fit(
        module,
        data,
        objective,
        TrainConfig(steps=24, batch_size=16, lr=1e-2, val_fraction=0.25, seed=1),
    )
    assert result.steps == 24 and len(result.val) > 2
    assert result.final_loss < 0.8 * result.first_loss  # on the held-out quarter
    assert result.to_dict()["curve"][-1]["step"] == 24
    trained = export(module, model)
    x = image_batch(rng)
    with torch.no_grad():
        want = module(torch.from_numpy(x["x"])).numpy()
    np.testing.assert_allclose(run_model(trained, x)["y"], want, rtol=1e-4, atol=1e-5)
    # the original is untouched
    assert not np.allclose(run_model(model, x)["y"], want, atol=1e-3)


def test_kl_formula():
    s = torch.tensor([[1.0, 2.0, 0.5]])
    t = torch.tensor([[0.5, 1.5, 2.0]])
    T = 3.0
    p = np.exp(t.numpy() / T) / np.exp(t.numpy() / T).sum()
    q = np.exp(s.numpy() / T) / np.exp(s.numpy() / T).sum()
    want = float((p * np.log(p / q)).sum() * T * T)
    assert float(_soft("kl", s, t, T)) == pytest.approx(want, rel=1e-5)
