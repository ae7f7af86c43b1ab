"""batchnorm-to-scale: an unfused inference BatchNormalization becomes Mul + Add."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, init, model_from_text, refusals

from modelpress.passes import optimize
from modelpress.verify import verify


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def bn_params(c: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    scale, bias, mean = rng.standard_normal((3, c))
    var = rng.uniform(0.2, 2.0, c)
    return (
        f"float[{c}] s = {lit(scale)}, float[{c}] b = {lit(bias)}, "
        f"float[{c}] mu = {lit(mean)}, float[{c}] var = {lit(var)}"
    )


def affine(seed: int, c: int, eps: float = 1e-5):
    """The scale and shift of ``bn_params(c, seed)`` by BatchNormalization's formula."""
    rng = np.random.default_rng(seed)
    scale, bias, mean = rng.standard_normal((3, c))
    var = rng.uniform(0.2, 2.0, c)
    k = scale.astype(np.float32).astype(np.float64) / np.sqrt(
        var.astype(np.float32).astype(np.float64) + eps
    )
    return k, bias.astype(np.float32).astype(np.float64) - mean.astype(np.float32).astype(
        np.float64
    ) * k


def run(text: str):
    before = model_from_text(text)
    after = model_from_text(text)
    return before, optimize(after, passes=["batchnorm-to-scale", "dead-code"])


def test_bn_after_relu_becomes_mul_add_with_channel_constants():
    text = f"""
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[N, 3, H, 5] x) => (float[N, 3, H, 5] y) <{bn_params(3)}> {{
      r = Relu(x)
      y = BatchNormalization<epsilon = 0.001>(r, s, b, mu, var)
    }}
    """
    before, result = run(text)
    after = result.model
    # the constants follow the formula, shaped (C, 1, 1) for channel axis 1
    k, t = affine(0, 3, 1e-3)
    assert_graph_equal(
        after,
        f"""
        <ir_version: 8, opset_import: ["" : 15]>
        g (float[N, 3, H, 5] x) => (float[N, 3, H, 5] y) <{init("k", k.reshape(3, 1, 1))}, {init("t", t.reshape(3, 1, 1))}> {{
          r = Relu(x)
          m = Mul(r, k)
          y = Add(m, t)
        }}
        """,
    )
    res = verify(before, after, dims={"N": 2, "H": 4}, rtol=1e-6, atol=1e-6)
    assert res.passed, res


def test_rank2_input_gets_per_column_constants():
    text = f"""
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[N, 4] x) => (float[N, 4] y) <{bn_params(4, seed=1)}> {{
      y = BatchNormalization(x, s, b, mu, var)
    }}
    """
    before, result = run(text)
    k, t = affine(1, 4)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 15]>
        g (float[N, 4] x) => (float[N, 4] y) <{init("k", k)}, {init("t", t)}> {{
          m = Mul(x, k)
          y = Add(m, t)
        }}
        """,
    )
    assert verify(before, result.model, dims={"N": 6}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "graph_head, body, reason",
    [
        (
            "(float[2, 3, 4] x) => (float[2, 3, 4] y, float[3] rm, float[3] rv)",
            "y, rm, rv = BatchNormalization<training_mode = 1>(x, s, b, mu, var)",
            "training mode: it normalizes with the batch's own statistics",
        ),
        (
            "(float[2, 3, 4] x, float[3] m) => (float[2, 3, 4] y)",
            "y = BatchNormalization(x, s, b, m, var)",
            "scale, bias, mean and variance are not all constant 1-D floats",
        ),
        (
            "(float[2, 3, 4] x, int64[K] shp) => (float[2, 3, 4] y)",
            "r = Reshape(x, shp)\n y = BatchNormalization(r, s, b, mu, var)",
            "the input's rank is unknown or below 2 (it shapes the constants)",
        ),
        (
            "(float[2, 3, 4] x) => (float[2, 3, 4] y)",
            "c = Conv<kernel_shape = [1]>(x, w)\n y = BatchNormalization(c, s, b, mu, var)",
            "fuse-conv-bn folds it into the op before",
        ),
    ],
)
def test_left_alone(graph_head, body, reason):
    text = f"""
    <ir_version: 8, opset_import: ["" : 15]>
    g {graph_head} <{bn_params(3)}, float[3, 3, 1] w = {lit(np.eye(3))}> {{
      {body}
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "batchnorm-to-scale") == [reason]
    assert_graph_equal(model, text)


def test_bn_inside_a_loop_body_is_replaced():
    text = f"""
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[2, 3] x) => (float[2, 3] y) <{bn_params(3)}, int64 n = {{3}}, bool go = {{1}}> {{
      y = Loop(n, go, x) <body = body (int64 i, bool cond, float[2, 3] v) => (bool co, float[2, 3] vo) {{
        co = Identity(cond)
        vo = BatchNormalization(v, s, b, mu, var)
      }}>
    }}
    """
    before, result = run(text)
    k, t = affine(0, 3)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 15]>
        g (float[2, 3] x) => (float[2, 3] y) <int64 n = {{3}}, bool go = {{1}}> {{
          y = Loop(n, go, x) <body = body (int64 i, bool cond, float[2, 3] v) => (bool co, float[2, 3] vo)
                              <{init("k", k)}, {init("t", t)}> {{
            co = Identity(cond)
            m = Mul(v, k)
            vo = Add(m, t)
          }}>
        }}
        """,
    )
    assert verify(before, result.model, rtol=1e-5, atol=1e-6).passed
