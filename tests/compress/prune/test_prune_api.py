"""prune(): unstructured and 2:4 masks, fine-tuning that keeps the zeros, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import residual_cnn

from modelpress.cli.main import main
from modelpress.compress.prune import unstructured as unstr
from modelpress.compress.prune.api import prune
from modelpress.compress.train import TrainConfig
from modelpress.ir import load, save
from modelpress.ir.match import const_array


def _data(rng, n=48):
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)}


def test_global_and_layer_sparsity_exact():
    model = residual_cnn()
    masks, _ = unstr.masks(model, sparsity=0.6, scope="global")
    total = sum(m.size for m in masks.values())
    assert sum(int((~m).sum()) for m in masks.values()) == round(0.6 * total)
    # the smallest magnitudes go first: every pruned weight is below every kept one
    weights = {n: const_array(model.graph.initializers[n]) for n in masks}
    pruned = np.concatenate([np.abs(weights[n][~m]) for n, m in masks.items()])
    kept = np.concatenate([np.abs(weights[n][m]) for n, m in masks.items()])
    assert pruned.max() <= kept.min()
    layer, _ = unstr.masks(model, sparsity=0.5, scope="layer")
    for m in layer.values():
        assert int((~m).sum()) == round(0.5 * m.size)


def test_two_four_pattern():
    model = residual_cnn()
    masks, dense = unstr.masks(model, pattern="2:4")
    # weights whose reduction length is not a multiple of 4 (the stem reads 3 channels, a Conv
    # reads 6) stay dense, and are named
    short = sorted(
        w.name
        for w in unstr.prunable_weights(model)
        if const_array(model.graph.initializers[w.name]).shape[w.axis] % 4
    )
    assert sorted(dense) == short and len(short) == 2
    for w in unstr.prunable_weights(model):
        if w.name in masks:
            groups = np.moveaxis(masks[w.name], w.axis, -1).reshape(-1, 4)
            assert (groups.sum(1) == 2).all()
            kept = np.moveaxis(
                np.abs(const_array(model.graph.initializers[w.name])), w.axis, -1
            ).reshape(-1, 4)
            # the two kept are the two largest of each 4
            assert (
                np.sort(kept[groups.astype(bool)].reshape(-1, 2), 1)[:, 0] >= np.sort(kept, 1)[:, 1]
            ).all()


def test_unstructured_fine_tuning_keeps_zeros(rng):
    model = residual_cnn()
    result = prune(
        model,
        data=_data(rng),
        sparsity=0.7,
        train=TrainConfig(steps=4, batch_size=16, lr=1e-2, val_fraction=0),
    )
    assert result.sparsity == pytest.approx(0.7, abs=0.01)
    masks, _ = unstr.masks(model, sparsity=0.7)
    for name, m in masks.items():
        w = const_array(result.model.graph.initializers[name])
        assert (w[~m] == 0).all()
        assert not np.allclose(w[m], const_array(model.graph.initializers[name])[m])  # trained
    assert result.training[0].steps == 4 and result.check.cosine is not None


def test_structured_with_data_and_rounds(rng):
    model = residual_cnn()
    result = prune(
        model, data=_data(rng), ratio=0.5, rounds=2, train=TrainConfig(steps=2, batch_size=16)
    )
    assert len(result.rounds) == 2 and len(result.training) == 2
    assert result.params_after < 0.6 * result.params_before
    assert result.check is not None and 0 <= result.check.agreement <= 1


def test_cli_prune_and_bad_data(tmp_path, rng, capsys):
    save(residual_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", **_data(rng), y=np.zeros(48, np.int64))
    out = tmp_path / "p.onnx"
    code = main(
        [
            "prune",
            str(tmp_path / "m.onnx"),
            "-o",
            str(out),
            "--data",
            str(tmp_path / "d.npz"),
            "--labels-key",
            "y",
            "--ratio",
            "0.5",
            "--steps",
            "2",
            "--no-latency",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    # half of a random CNN's channels gone and 2 steps: far outside the default budget, refused
    assert code == 1 and not out.exists()
    assert "--keep-anyway" in capsys.readouterr().err
    record = __import__("json").loads((tmp_path / "r.json").read_text())["result"]
    assert record["written"] is None and record["budget"]["failures"]
    argv = [
        "prune", str(tmp_path / "m.onnx"), "-o", str(out), "--data", str(tmp_path / "d.npz"),
        "--labels-key", "y", "--ratio", "0.5", "--steps", "2", "--no-latency",
    ]  # fmt: skip
    assert main([*argv, "--keep-anyway", "--json", str(tmp_path / "r.json")]) == 0
    assert out.exists()
    assert load(out).graph.initializers and (tmp_path / "r.json").exists()
    # bad data: one error line, exit 1, nothing written
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 3, 9, 9), np.float32))
    out2 = tmp_path / "q.onnx"
    code = main(
        ["prune", str(tmp_path / "m.onnx"), "-o", str(out2), "--data", str(bad), "--ratio", "0.5"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error:") and "size 9" in err[0]
    assert not out2.exists()
    code = main(
        [
            "prune",
            str(tmp_path / "m.onnx"),
            "-o",
            str(out2),
            "--data",
            str(tmp_path / "d.npz"),
            "--labels-key",
            "label",
            "--ratio",
            "0.5",
        ]
    )
    assert code == 1 and "'label'" in capsys.readouterr().err and not out2.exists()
