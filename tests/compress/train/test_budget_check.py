"""A training step is judged as deployed: the model before training is kept when training made it
worse under ONNX Runtime (``finetune``), and the CLI refuses a result outside the budget (exit 1,
nothing written) unless --keep-anyway. Before: prune, distill and compress without labels on a
real export printed cosine 0.57 and exited 0."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from train_models import residual_cnn

from modelpress.cli.main import main
from modelpress.compress.train import TrainConfig, TrainData
from modelpress.compress.train.budget import Budget, score
from modelpress.compress.train.finetune import finetune
from modelpress.ir import save
from modelpress.ir.match import const_array
from modelpress.verify import run_model
from modelpress.verify.metrics import Comparison, compare


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def _export_that_drifts(monkeypatch):
    """The trained weights come back from PyTorch changed (as an exporter that disagrees with the
    training graph does): PyTorch's held-out loss looks fine, the deployed model is not."""
    from modelpress.compress.train import finetune as module

    real = module.modules.export

    def drifting(student, model):
        out = real(student, model)
        for name, value in out.graph.initializers.items():
            w = const_array(value)
            if w is not None and w.dtype == np.float32 and w.ndim == 4:
                value.const_value = ir.tensor(-w, name=name)
        return out

    monkeypatch.setattr(module.modules, "export", drifting)


def test_training_that_makes_the_deployed_model_worse_is_undone(monkeypatch):
    model = residual_cnn()
    data = TrainData.load({"x": _x(64)}, model)
    held = TrainData.load({"x": _x(32, seed=1)}, model)
    config = TrainConfig(steps=4, batch_size=16, lr=1e-3)
    _export_that_drifts(monkeypatch)
    kept, result = finetune(model, data, teacher=model, config=config, held_out=held)
    assert result.steps == 4 and result.fell_back
    assert result.score_before == 1.0 and result.score_after < 1.0
    assert kept is model  # the model before training, untouched
    assert result.to_dict()["fell_back"] is True
    monkeypatch.undo()
    # a gentle run that does not hurt is kept as trained
    gentle = TrainConfig(steps=2, batch_size=16, lr=1e-6, optimizer="sgd", schedule="constant")
    trained, result = finetune(model, data, teacher=model, config=gentle, held_out=held)
    assert not result.fell_back and trained is not model
    x = _x(4, seed=2)
    np.testing.assert_allclose(
        run_model(trained, {"x": x})["y"], run_model(model, {"x": x})["y"], rtol=0, atol=1e-3
    )
    assert score(compare(model, trained, held)) == pytest.approx(1.0)


def test_the_budget_reads_the_most_telling_measure():
    b = Budget()
    labelled = Comparison(samples=50, accuracy_before=0.9, accuracy_after=0.86, agreement=0.5)
    assert "top-1 accuracy fell 90.00% → 86.00%" in b.failures(labelled)[0]
    assert Budget(max_accuracy_drop=0.05).failures(labelled) == []  # agreement is not read
    unlabelled = Comparison(samples=50, agreement=0.3, cosine=0.99)
    assert "top-1 agreement with the original is 30.00%" in b.failures(unlabelled)[0]
    embedding = Comparison(samples=50, cosine=0.57)
    assert "output cosine with the original is 0.5700" in b.failures(embedding)[0]
    assert b.failures(Comparison(samples=50, cosine=0.95)) == [] and b.failures(None) == []
    assert score(labelled) == 0.86 and score(unlabelled) == 0.3 and score(embedding) == 0.57


def test_distill_outside_the_budget_writes_nothing_unless_kept_anyway(tmp_path, capsys):
    src = save(residual_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=_x(48))
    out = tmp_path / "s.onnx"
    argv = ["distill", str(src), "-o", str(out), "--data", str(tmp_path / "d.npz")]
    argv += ["--width", "0.5", "--steps", "2", "--json", str(tmp_path / "r.json")]
    # before: exit 0 and the student written, whatever it had learnt
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "not written: top-1 agreement with the original is" in err
    assert "--min-agreement" in err and "--keep-anyway" in err and not out.exists()
    record = json.loads((tmp_path / "r.json").read_text())["result"]
    assert record["written"] is None and record["budget"]["min_agreement"] == 0.9
    assert main([*argv, "--keep-anyway"]) == 0 and out.exists()
    assert "outside the budget" in capsys.readouterr().out
    assert main([*argv[:-2], "-o", str(tmp_path / "t.onnx"), "--min-agreement", "0"]) == 0
    assert main([*argv, "--min-agreement", "2"]) == 1
    assert "--min-agreement 2" in capsys.readouterr().err


def test_prune_keeps_the_weights_before_a_harmful_fine_tuning(tmp_path, capsys, monkeypatch):
    src = save(residual_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=_x(64))
    base = ["prune", str(src), "--data", str(tmp_path / "d.npz"), "--sparsity", "0.1"]
    base += ["--no-latency", "--keep-anyway", "--val-fraction", "0.25"]
    assert main([*base, "-o", str(tmp_path / "none.onnx"), "--no-train"]) == 0
    _export_that_drifts(monkeypatch)
    assert main([*base, "-o", str(tmp_path / "p.onnx"), "--steps", "4"]) == 0
    assert "made the model worse as ONNX Runtime runs it" in capsys.readouterr().out
    from modelpress.ir import load

    untrained, kept = load(tmp_path / "none.onnx"), load(tmp_path / "p.onnx")
    for name, value in untrained.graph.initializers.items():
        np.testing.assert_array_equal(
            const_array(kept.graph.initializers[name]), const_array(value)
        )
