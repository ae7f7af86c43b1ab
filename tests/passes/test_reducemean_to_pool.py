"""reducemean-to-pool: a ReduceMean over every spatial axis becomes GlobalAveragePool (+ Flatten)."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, model_from_text, refusals

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
    body = (
        "y = GlobalAveragePool(x)"
        if want == ["GlobalAveragePool"]
        else "p = GlobalAveragePool(x)\n y = Flatten<axis = 1>(p)"
    )
    assert_graph_equal(
        after,
        f"""
        <ir_version: 10, opset_import: ["" : {opset}]>
        g (float[{shape}] x) => (float y) {{
          {body}
        }}
        """,
    )
    dims = [4 if d == "N" else int(d) for d in shape.split(", ")]
    x = rng.standard_normal(dims).astype(np.float32)
    want_y, got_y = run_model(before, {"x": x})["y"], run_model(after, {"x": x})["y"]
    assert got_y.shape == want_y.shape
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)


def left_alone(src: str) -> list[str]:
    """The reasons reducemean-to-pool gives for leaving ``src`` as it is."""
    model = model_from_text(src)
    reasons = refusals(model, "reducemean-to-pool")
    assert_graph_equal(model, src)
    return reasons


@pytest.mark.parametrize(
    ("axes", "shape", "reason"),
    [
        ([1], "N, 3, 5, 6", "the axes [1] are not exactly the spatial axes 2..3"),
        ([2], "N, 3, 5, 6", "the axes [2] are not exactly the spatial axes 2..3"),
        ([1, 2, 3], "N, 3, 5, 6", "the axes [1, 2, 3] are not exactly the spatial axes 2..3"),
        ([1], "N, 3", "rank 2: only [N, C, spatial...] of rank >= 4 is pooled"),
    ],
    ids=["channels", "one-spatial-axis", "with-channels", "rank-2"],
)
def test_other_reductions_left_alone(axes, shape, reason):
    assert left_alone(text(18, axes, 1, shape)) == [reason]


def test_layernorm_mean_over_last_axis_of_rank3_left_alone():
    """[B, T, D] with a mean over D is a LayerNorm's: ONNX Runtime fuses it only as ReduceMean."""
    assert left_alone(text(13, [2], 1, "N, 3, 7")) == [
        "rank 3: only [N, C, spatial...] of rank >= 4 is pooled"
    ]


def test_mean_subtracted_from_its_input_left_alone():
    src = """
    <ir_version: 10, opset_import: ["" : 13]>
    g (float[N, 4, 5, 6] x) => (float[N, 4, 5, 6] y) {
      m = ReduceMean<axes = [2, 3], keepdims = 1>(x)
      y = Sub(x, m)
    }
    """
    assert left_alone(src) == ["the mean is subtracted from its own input (a normalization)"]


@pytest.mark.parametrize(("opset", "rewritten"), [(18, False), (22, True)])
def test_bfloat16_only_where_the_pool_takes_it(opset, rewritten):
    src = text(opset, [2, 3], 1).replace("float[", "bfloat16[").replace("(float y)", "(bfloat16 y)")
    if rewritten:
        after = optimize(model_from_text(src), passes=PASSES + ["dead-code"]).model
        assert_graph_equal(
            after,
            f"""
            <ir_version: 10, opset_import: ["" : {opset}]>
            g (bfloat16[N, 3, 5, 6] x) => (bfloat16 y) {{
              y = GlobalAveragePool(x)
            }}
            """,
        )
    else:
        assert left_alone(src) == [f"GlobalAveragePool does not take BFLOAT16 (at opset {opset})"]
