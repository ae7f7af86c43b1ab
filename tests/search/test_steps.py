"""Step kinds are registered classes, like the passes: visible, listed, and extensible."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.ir import parse
from modelpress.search import STEPS, parse_recipe, register_step, run_recipe
from modelpress.search.steps import MODEL, Applied, Context, StepKind, get_step

MODEL_TEXT = """<ir_version: 8, opset_import: ["" : 17]> g (float[N, 4] x) => (float[N, 4] y) {
    y = Relu(x)
}"""


def test_the_built_in_kinds_are_registered_objects():
    assert {"convert", "optimize", "quantize", "prune", "protect", "bench"} <= set(STEPS)
    quantize = get_step("quantize")
    assert type(quantize).__name__ == "QuantizeStep" and quantize.position == MODEL
    opts = quantize.options()
    assert opts["data"].path and "static" in opts["mode"].choices
    assert "progress" not in opts  # not a recipe option
    assert get_step("optimize").options()["level"].choices == (0, 1, 2, 3)


def test_a_new_kind_is_a_class_and_the_bench_compares_with_the_context(tmp_path):
    seen = {}

    @register_step
    class Identity(StepKind):
        name = "identity-test"
        summary = "the model as it is"

        def options(self):
            return {}

        def apply(self, model, opts, ctx: Context) -> Applied:
            seen["reference"] = ctx.reference
            return Applied(model, {"nodes": len(model.graph)})

    try:
        recipe = parse_recipe("steps:\n  - identity-test:\n  - bench: {seconds: 0.05}\n")
        model = parse(MODEL_TEXT)
        result = run_recipe(recipe, model=model)
        assert seen["reference"] is model
        assert result.steps[0] == {"identity-test": {"nodes": 1}}
        assert "ratio" in result.steps[1]["bench"]
        with pytest.raises(AssertionError, match="duplicate"):
            register_step(Identity)
    finally:
        del STEPS["identity-test"]


def test_training_steps_train_for_at_least_min_train_steps(tmp_path):
    from modelpress.compress.prune.api import DEFAULT_TRAINING
    from modelpress.ir.files import write_npz
    from modelpress.search.steps import _at_least

    assert (DEFAULT_TRAINING.epochs, DEFAULT_TRAINING.batch_size) == (2, 32)
    assert DEFAULT_TRAINING.val_fraction == 0.1
    ref = "modelpress.compress.prune.api:DEFAULT_TRAINING"
    for n, want in ((227, 150), (10_000, 2 * 282)):  # 2 epochs of ceil(0.9 n / 32) steps
        write_npz(tmp_path / "d.npz", {"x": np.zeros((n, 2), np.float32), "y": np.zeros(n, int)})
        config = _at_least(ref, 150, str(tmp_path / "d.npz"), None)
        assert config.steps == want and config.lr == DEFAULT_TRAINING.lr
    # a limit on the samples counts too: 1,000 of them, 2 epochs of 29 steps < 150
    assert _at_least(ref, 150, str(tmp_path / "d.npz"), 1000).steps == 150
    assert _at_least(ref, 10, str(tmp_path / "d.npz"), 1000).steps == 58
