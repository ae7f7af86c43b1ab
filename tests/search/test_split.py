"""The validation split of labelled data (``search.split``) and ``auto`` judging on it.

References: class counts worked out by hand, index sets, and top-1 accuracy recomputed here with
ONNX Runtime on the held-out samples only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from quant_models import image_like, small_cnn

from modelpress.cli.main import main
from modelpress.errors import OptionError
from modelpress.ir import save
from modelpress.ir.feeds import load_npz
from modelpress.ir.files import write_npz
from modelpress.search import auto
from modelpress.search.engine import _candidate_of
from modelpress.search.metric import runner
from modelpress.search.split import MIN_PART, holdout_split, write_parts
from modelpress.search.steps import Context
from modelpress.search.trial import build


def test_the_split_is_disjoint_seeded_and_stratified():
    # classes of 100, 60 and 40 samples, interleaved: half of each is held out
    labels = np.array([0] * 100 + [1] * 60 + [2] * 40)[np.random.default_rng(1).permutation(200)]
    split = holdout_split(labels, fraction=0.5, seed=7)
    assert split.stratified and split.classes == 3
    assert np.intersect1d(split.train, split.validation).size == 0
    assert np.array_equal(np.union1d(split.train, split.validation), np.arange(200))
    assert [int((labels[split.validation] == c).sum()) for c in range(3)] == [50, 30, 20]
    assert [int((labels[split.train] == c).sum()) for c in range(3)] == [50, 30, 20]
    # a quarter: round(0.25 x 100, 60, 40) = 25, 15, 10
    q = holdout_split(labels, fraction=0.25, seed=7, min_part=10)
    assert [int((labels[q.validation] == c).sum()) for c in range(3)] == [25, 15, 10]
    # the same seed gives the same split, another seed another one
    again = holdout_split(labels, fraction=0.5, seed=7)
    assert np.array_equal(again.validation, split.validation)
    assert not np.array_equal(holdout_split(labels, seed=8).validation, split.validation)
    assert split.to_dict() == {
        "validation_fraction": 0.5,
        "seed": 7,
        "stratified": True,
        "classes": 3,
        "train_samples": 100,
        "validation_samples": 100,
    }


def test_labels_that_are_not_classes_split_at_random():
    values = np.random.default_rng(2).standard_normal(200).astype(np.float32)
    split = holdout_split(values, fraction=0.4, seed=0)
    assert not split.stratified and split.classes == 0
    assert len(split.validation) == 80 and len(split.train) == 120
    rows = holdout_split(np.zeros((200, 3), dtype=np.int64), fraction=0.5)  # several per sample
    assert not rows.stratified


def test_too_few_samples_or_a_bad_fraction():
    assert holdout_split(np.arange(2 * MIN_PART - 2) % 2) is None  # 63 and 63
    assert holdout_split(np.arange(2 * MIN_PART) % 2) is not None  # 64 and 64
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(OptionError, match="validation_fraction"):
            holdout_split(np.arange(200) % 3, fraction=bad)


def test_the_parts_keep_rows_whole(tmp_path):
    n = 160
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n) % 4
    split = holdout_split(y, seed=3)
    val, train = write_parts({"x": x, "y": y, "scale": np.float32(2.0)}, split, tmp_path)
    v, t = load_npz(val), load_npz(train)
    np.testing.assert_array_equal(v["x"], x[split.validation])
    np.testing.assert_array_equal(t["y"], y[split.train])
    np.testing.assert_array_equal(v["y"], (v["x"][:, 0] / 3).astype(int) % 4)
    assert float(v["scale"]) == 2.0  # not one row per sample: copied whole


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    model = small_cnn()
    x = image_like(np.random.default_rng(3), (160, 4, 8, 8))
    logits = runner(model)({"x": x})["y"]
    y = (logits - logits.mean(axis=0)).argmax(axis=1).astype(np.int64)
    save(model, folder / "cnn.onnx")
    write_npz(folder / "data.npz", {"x": x, "y": y})
    return folder, model, x, y


def _top1(model, x, y) -> float:
    return float((runner(model)({"x": x})["y"].argmax(axis=1) == y).mean())


@pytest.mark.slow  # three candidates train (300 steps each) and one is trained again
def test_auto_trains_on_one_part_and_judges_every_candidate_on_the_other(labelled, tmp_path):
    folder, model, x, y = labelled
    result = auto(
        folder / "cnn.onnx",
        data=folder / "data.npz",
        labels_key="y",
        max_accuracy_drop=1.0,
        levels=[2],
        modes=["float"],
        timing_s=0.05,
        cache_dir=tmp_path / "cache",
    )
    split = holdout_split(y)  # the default fraction and seed
    assert result.split == split.to_dict()
    assert result.to_dict()["split"]["validation_samples"] == len(split.validation)
    val = split.validation
    assert result.reference.score == _top1(model, x[val], y[val])
    trained = [t for t in result.trials if "prune" in t.label or "distill" in t.label]
    assert len(trained) == 3 and all(t.ok for t in trained), [t.error for t in trained]
    for t in trained:  # trained on the other part only
        ((_kind, opts),) = t.steps[-1].items()
        np.testing.assert_array_equal(load_npz(opts["data"])["x"], x[split.train])
    # and judged on the held-out part: one rebuilt here (training is seeded), scored by hand
    rebuilt, _ = build(_candidate_of(trained[1]), model, Context())
    assert trained[1].score == _top1(rebuilt, x[val], y[val])


def test_no_train_keeps_the_split_and_leaves_training_out(labelled, tmp_path):
    folder, model, x, y = labelled
    result = auto(
        folder / "cnn.onnx",
        data=folder / "data.npz",
        labels_key="y",
        train=False,
        max_accuracy_drop=1.0,
        levels=[2],
        modes=["float", "static"],
        methods=["minmax"],
        timing_s=0.05,
        cache_dir=tmp_path / "cache",
    )
    assert result.split is not None
    assert [t.label for t in result.trials] == ["original", "O2", "O2 · static/minmax"]
    # calibrated on the training part, as a training candidate would have trained
    calib = load_npz(result.trials[2].steps[1]["quantize"]["data"])
    np.testing.assert_array_equal(calib["x"], x[holdout_split(y).train])


def test_the_cli_records_the_split(labelled, tmp_path):
    folder, _model, _x, y = labelled
    code = main(
        [
            "auto",
            str(folder / "cnn.onnx"),
            "-o",
            str(tmp_path / "best.onnx"),
            "--data",
            str(folder / "data.npz"),
            "--labels-key",
            "y",
            "--validation-fraction",
            "0.45",
            "--split-seed",
            "4",
            "--no-train",
            "--levels",
            "2",
            "--modes",
            "float",
            "--timing",
            "0.05",
            "--json",
            str(tmp_path / "auto.json"),
        ]
    )
    assert code == 0
    record = json.loads((tmp_path / "auto.json").read_text())
    split = holdout_split(y, fraction=0.45, seed=4)
    assert record["result"]["split"] == split.to_dict()
