"""``auto``: a search on a small CNN under a short budget, against references computed here.

The model is ``quant_models.small_cnn``; its labels are derived from its own outputs, and scores
are recomputed here with ONNX Runtime.
Timing is short (0.05 s a trial): these tests check what is chosen and why, not speed.
"""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import image_like, small_cnn

from modelpress.cli.main import main
from modelpress.ir import save
from modelpress.ir.files import write_npz
from modelpress.search import auto, pareto
from modelpress.search.engine import CALIBRATION_SAMPLES
from modelpress.search.metric import runner
from modelpress.search.space import FLOAT, TRAINING_MODES, build_space
from modelpress.search.trial import build

FAST = {
    "timing_s": 0.05,
    "levels": [1, 2],
    "modes": ["float", "static"],
    "methods": ["minmax", "percentile"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auto")
    model = small_cnn()
    x = image_like(np.random.default_rng(3), (64, 4, 8, 8))
    logits = runner(model)({"x": x})["y"]
    # labels: the float model's answers once the logits' common part is taken out (its raw
    # argmax is one class for every sample), so that the classes vary
    y = (logits - logits.mean(axis=0)).argmax(axis=1).astype(np.int64)
    save(model, folder / "cnn.onnx")
    write_npz(folder / "val.npz", {"x": x, "y": y})
    return folder, x, y


def _top1(model, x, y) -> float:
    out = runner(model)({"x": x})["y"]
    return float((out.argmax(axis=1) == y).mean())


def test_a_search_returns_its_front_and_a_winner_within_the_budget(files, tmp_path):
    folder, x, y = files
    result = auto(
        folder / "cnn.onnx",
        data=folder / "val.npz",
        labels_key="y",
        max_accuracy_drop=0.05,
        time_budget_s=120,
        cache_dir=tmp_path / "cache",
        **FAST,
    )
    ok = [t for t in result.trials if t.ok and t.steps]
    # 2 levels x (float + 2 observers), no refinement needed: everything was within the budget
    assert len(ok) == 6 and result.met and result.evaluated == 7 and result.cached == 0
    w = result.winner
    # the drop is measured on the samples calibration did not see: recomputed here
    held = min(CALIBRATION_SAMPLES, len(x) // 4)
    assert w.score == pytest.approx(_top1(result.model, x[held:], y[held:]), abs=1e-12)
    original = _top1(small_cnn(), x[held:], y[held:])
    assert result.reference.score == pytest.approx(original, abs=1e-12)
    assert w.drop <= 0.05 and (w.lossless or w.drop == pytest.approx(original - w.score, abs=1e-12))
    # the fastest within the budget, up to the timing tie
    assert w.ratio <= min(t.ratio for t in ok if pareto.within(t, 0.05)) * (1 + pareto.TIE)
    # the front: nothing on it is dominated, everything off it is
    front = result.front
    assert front and all(not pareto.dominates(a, b) for a in front for b in front)
    assert all(
        any(pareto.dominates(f, t) for f in front)
        or t in front
        or any(pareto._objectives(f) == pareto._objectives(t) for f in front)
        for t in ok
    )
    # the written model is the winner's steps replayed
    rebuilt, _ = build(_candidate(w), small_cnn(), _ctx())
    a, b = runner(rebuilt)({"x": x}), runner(result.model)({"x": x})
    np.testing.assert_array_equal(a["y"], b["y"])


def _candidate(trial):
    from modelpress.search.engine import _candidate_of

    return _candidate_of(trial)


def _ctx():
    from modelpress.search.steps import Context

    return Context()


def test_a_stopped_search_resumes_from_its_cached_trials(files, tmp_path, monkeypatch):
    import modelpress.search.engine as search_auto

    folder, _, _ = files
    calls = []
    real = search_auto.evaluate
    monkeypatch.setattr(
        search_auto, "evaluate", lambda *a, **k: calls.append(a[0].label()) or real(*a, **k)
    )

    def stop_after_three(event):
        if event.kind == "trial" and len(calls) == 3:
            raise KeyboardInterrupt

    kw = dict(
        data=folder / "val.npz",
        labels_key="y",
        max_accuracy_drop=0.05,
        time_budget_s=120,
        cache_dir=tmp_path / "cache",
        **FAST,
    )
    with pytest.raises(KeyboardInterrupt):
        auto(folder / "cnn.onnx", progress=stop_after_three, **kw)
    first = list(calls)
    assert len(first) == 3
    calls.clear()
    again = auto(folder / "cnn.onnx", **kw)
    # the three trials of the stopped search are read back, none of them evaluated again
    assert again.cached == 3 and again.evaluated == len(calls) == len(again.trials) - 3
    assert not set(first) & set(calls)
    calls.clear()
    third = auto(folder / "cnn.onnx", **kw)
    assert (
        calls == [] and third.cached == len(third.trials) and third.winner.key == again.winner.key
    )
    # a different metric is a different search: nothing reused
    other = auto(folder / "cnn.onnx", **{**kw, "labels_key": None})
    assert other.cached == 0


def test_an_impossible_budget_writes_the_best_found_and_says_so(files, tmp_path, capsys):
    folder, _, _ = files
    out = tmp_path / "best.onnx"
    code = main(
        [
            "auto",
            str(folder / "cnn.onnx"),
            "-o",
            str(out),
            "--data",
            str(folder / "val.npz"),
            "--metric",
            "mse",
            "--max-accuracy-drop",
            "0",
            "--levels",
            "2",
            "--modes",
            "static",
            "--methods",
            "minmax,percentile",
            "--timing",
            "0.05",
            "--cache",
            str(tmp_path / "c"),
            "--max-float-layers",
            "0",
            "--json",
            str(tmp_path / "auto.json"),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and out.is_file() and (tmp_path / "best.recipe.yaml").is_file()
    assert "budget not met" in text and "written anyway" in text
    import json

    r = json.loads((tmp_path / "auto.json").read_text())["result"]
    trials = [t for t in r["trials"] if t["steps"]]
    assert not r["met"] and all(t["drop"] > 0 for t in trials)
    # the best found is the closest to the budget, and the record says by how much it missed
    assert r["winner"]["drop"] == min(t["drop"] for t in trials) == r["shortfall"]


def test_a_time_budget_shorter_than_a_trial_still_ends_with_a_model(files, tmp_path):
    folder, _, _ = files
    result = auto(
        folder / "cnn.onnx",
        data=folder / "val.npz",
        labels_key="y",
        time_budget_s=1e-3,
        cache_dir=None,
        **FAST,
    )
    assert result.stopped.startswith("time budget reached") and result.model is not None
    assert [t.label for t in result.trials] == ["original", "O2"] and result.met


def test_the_space_comes_from_the_registries(monkeypatch):
    from modelpress.compress.quantize import MODES
    from modelpress.compress.quantize.observers import OBSERVERS

    cpu = build_space(gpu=False, quantize_options={})
    gpu = build_space(gpu=True, quantize_options={})
    # (training modes join only with training data)
    assert set(cpu.modes) == {FLOAT, *MODES} - {"fp16", "bf16"} - TRAINING_MODES
    assert set(gpu.modes) == {FLOAT, *MODES} - TRAINING_MODES
    trained = build_space(gpu=False, quantize_options={}, train_options={"data": "t.npz"})
    assert set(trained.modes) == {FLOAT, *MODES} - {"fp16", "bf16"}
    assert [v["method"] for v in dict(cpu.variants)["static"]] == list(OBSERVERS)
    # a mode registered later joins the search by itself, with its defaults
    monkeypatch.setitem(MODES, "toy", MODES["dynamic"])
    later = build_space(gpu=False, quantize_options={"calibration": "d.npz"})
    toy = [c for c in later.candidates() if c.mode == "toy"]
    assert len(toy) == len(later.levels) and toy[0].step("quantize").opts == {
        "mode": "toy",
        "optimize": False,
        "calibration": "d.npz",
    }


def test_a_catalog_gpu_is_estimated_by_the_advisor(files):
    from modelpress.advisor import estimate, load_catalog
    from modelpress.profile.workload import workload_from_onnx

    folder, _, _ = files
    result = auto(
        folder / "cnn.onnx",
        data=folder / "val.npz",
        labels_key="y",
        target="A100 SXM4 80GB",
        levels=[2],
        modes=["float", "fp16"],
        timing_s=0.05,
    )
    assert result.estimated and all(t.latency["estimated"] for t in result.trials)
    gpu = load_catalog().find("A100 SXM4 80GB")
    fp16 = next(t for t in result.trials if "fp16" in t.label)
    model, _ = build(_candidate(fp16), small_cnn(), _ctx())
    want = estimate(
        workload_from_onnx(model, name="candidate"), gpu, task="infer", precision="fp16", batch=1
    )
    assert fp16.latency["median_ms"] == pytest.approx(want.latency_ms, rel=1e-9)
    assert fp16.latency["precision"] == "fp16"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--time-budget", "ten minutes"], "--time-budget ten minutes: write a duration"),
        (["--levels", "7"], "--levels 7: optimizer levels are"),
        (["--modes", "int3"], "--modes int3: choose among"),
        (["--methods", "nope"], "--methods nope: unknown calibration method"),
        (["--metric", "top1"], "--metric top1 needs labels"),
    ],
)
def test_bad_options_are_one_line(files, tmp_path, capsys, argv, message):
    folder, _, _ = files
    code = main(
        [
            "auto",
            str(folder / "cnn.onnx"),
            "-o",
            str(tmp_path / "b.onnx"),
            "--data",
            str(folder / "val.npz"),
            "--timing",
            "0.05",
            "--cache",
            str(tmp_path / "c"),
            *argv,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "b.onnx").exists()


def test_training_data_lets_pruning_and_qat_in(files, tmp_path):
    folder, x, y = files
    write_npz(tmp_path / "train.npz", {"x": x[:48], "y": y[:48]})
    write_npz(tmp_path / "val.npz", {"x": x[48:], "y": y[48:]})
    result = auto(
        folder / "cnn.onnx",
        data=tmp_path / "val.npz",
        labels_key="y",
        train_data=tmp_path / "train.npz",
        max_accuracy_drop=1.0,
        levels=[2],
        modes=["float", "qat"],
        timing_s=0.05,
    )
    labels = [t.label for t in result.trials]
    assert labels == [
        "original",
        "O2",
        "O2 · qat",
        "O2 · prune(ratio=0.25)",
        "O2 · prune(ratio=0.5)",
        "O2 · distill(width=0.5)",
    ]
    assert all(t.ok for t in result.trials), [t.error for t in result.trials]
    # the pruned and distilled candidates are smaller: channels were removed, not zeroed
    pruned = [t for t in result.trials if "prune" in t.label or "distill" in t.label]
    assert all(t.size_bytes < result.reference.size_bytes for t in pruned)
    # calibration and training read the training data, scoring all of --data
    assert result.trials[2].steps[1]["quantize"]["data"] == str(tmp_path / "train.npz")
