"""reducemean-to-pool: a ReduceMean over every spatial axis becomes GlobalAveragePool (+ Flatten)."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops

from modelpress.passes import optimize
from modelpress.verify import run_model

PASSES = ["reducemean-to-pool"]


def text(opset: int, axes: list[int], keep: int, shape: str = "N, 3, 5, 6", out: str = "") -> str:
    if opset >= 18:
        axes_const = f"int64[{len(axes)}] ax = {{{', '.join(map(str, axes))}}}"
        node = f"y = ReduceMean<keepdims = {keep}>(x, ax)"
    else:
        axes_const = "int64[1] unused = {0}"
        node = f"y = ReduceMean<keepdims = {keep}, axes = [{', '.join(map(str, axes))}]>(x)"
    return f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g (float[{shape}] x) => (float{out} y) <{axes_const}> {{
      {node}
    }}
    """


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(
    ("axes", "keep", "shape", "want"),
    [
        ([2, 3], 1, "N, 3, 5, 6", ["GlobalAveragePool"]),
        ([3, 2], 0, "N, 3, 5, 6", ["GlobalAveragePool", "Flatten"]),
        ([-1, -2], 1, "N, 3, 5, 6", ["GlobalAveragePool"]),
        ([2, 3, 4], 1, "N, 2, 3, 4, 5", ["GlobalAveragePool"]),
    ],
)
def test_spatial_mean_becomes_pool_with_same_values(rng, opset, axes, keep, shape, want):
    src = text(opset, axes, keep, shape)
    before = model_from_text(src)
    after = optimize(model_from_text(src), passes=PASSES + ["dead-code"]).model
    assert node_ops(after) == want
    dims = [4 if d == "N" else int(d) for d in shape.split(", ")]
    x = rng.standard_normal(dims).astype(np.float32)
    want_y, got_y = run_model(before, {"x": x})["y"], run_model(after, {"x": x})["y"]
    assert got_y.shape == want_y.shape
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("axes", "shape"),
    [([1], "N, 3, 5, 6"), ([2], "N, 3, 5, 6"), ([1, 2, 3], "N, 3, 5, 6"), ([1], "N, 3")],
    ids=["channels", "one-spatial-axis", "with-channels", "rank-2"],
)
def test_other_reductions_left_alone(axes, shape):
    after = optimize(model_from_text(text(18, axes, 1, shape)), passes=PASSES).model
    assert node_ops(after) == ["ReduceMean"]


def test_layernorm_mean_over_last_axis_of_rank3_left_alone():
    """[B, T, D] with a mean over D is a LayerNorm's: ONNX Runtime fuses it only as ReduceMean."""
    after = optimize(model_from_text(text(13, [2], 1, "N, 3, 7")), passes=PASSES).model
    assert node_ops(after) == ["ReduceMean"]


def test_mean_subtracted_from_its_input_left_alone():
    src = """
    <ir_version: 10, opset_import: ["" : 13]>
    g (float[N, 4, 5, 6] x) => (float[N, 4, 5, 6] y) {
      m = ReduceMean<axes = [2, 3], keepdims = 1>(x)
      y = Sub(x, m)
    }
    """
    after = optimize(model_from_text(src), passes=PASSES).model
    assert node_ops(after) == ["ReduceMean", "Sub"]


@pytest.mark.parametrize(("opset", "rewritten"), [(18, False), (22, True)])
def test_bfloat16_only_where_the_pool_takes_it(opset, rewritten):
    src = text(opset, [2, 3], 1).replace("float[", "bfloat16[").replace("floaty", "bfloat16 y")
    after = optimize(model_from_text(src.replace("(float y)", "(bfloat16 y)")), passes=PASSES).model
    assert (node_ops(after) == ["GlobalAveragePool"]) == rewritten
