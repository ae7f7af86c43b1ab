"""Step kinds are registered classes, like the passes: visible, listed, and extensible."""

from __future__ import annotations

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
