"""batchnorm-to-scale: an unfused inference BatchNormalization becomes Mul + Add."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops

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
    expected = model_from_text("""
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[N, 3, H, 5] x) => (float[N, 3, H, 5] y) <float[3, 1, 1] k = {1, 1, 1}, float[3, 1, 1] t = {0, 0, 0}> {
      r = Relu(x)
      m = Mul(r, k)
      y = Add(m, t)
    }
    """)
    assert node_ops(after) == node_ops(expected)
    mul, add = after.graph.node(1), after.graph.node(2)
    assert mul.inputs[0] is after.graph.node(0).outputs[0] and add.inputs[0] is mul.outputs[0]
    # the constants follow the formula, shaped (C, 1, 1) for channel axis 1
    rng = np.random.default_rng(0)
    scale, bias, mean = rng.standard_normal((3, 3))
    var = rng.uniform(0.2, 2.0, 3)
    k = scale / np.sqrt(var + 1e-3)
    np.testing.assert_allclose(mul.inputs[1].const_value.numpy(), k.reshape(3, 1, 1), rtol=1e-6)
    np.testing.assert_allclose(
        add.inputs[1].const_value.numpy(), (bias - mean * k).reshape(3, 1, 1), rtol=1e-5, atol=1e-6
    )
    assert add.outputs[0].name == "y" and [str(d) for d in after.graph.outputs[0].shape] == [
        "N",
        "3",
        "H",
        "5",
    ]
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
    assert node_ops(result.model) == ["Mul", "Add"]
    assert result.model.graph.node(0).inputs[1].const_value.shape == (4,)
    assert verify(before, result.model, dims={"N": 6}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "graph_head, body",
    [
        # training mode normalizes with the batch's own statistics
        (
            "(float[2, 3, 4] x) => (float[2, 3, 4] y, float[3] rm, float[3] rv)",
            "y, rm, rv = BatchNormalization<training_mode = 1>(x, s, b, mu, var)",
        ),
        # the statistics are a runtime input, not constants
        (
            "(float[2, 3, 4] x, float[3] m) => (float[2, 3, 4] y)",
            "y = BatchNormalization(x, s, b, m, var)",
        ),
        # unknown rank: the constants cannot be shaped for broadcasting
        (
            "(float[2, 3, 4] x, int64[K] shp) => (float[2, 3, 4] y)",
            "r = Reshape(x, shp)\n y = BatchNormalization(r, s, b, mu, var)",
        ),
        # fuse-conv-bn takes this one (into the Conv weights), so it is left for it
        (
            "(float[2, 3, 4] x) => (float[2, 3, 4] y)",
            "c = Conv<kernel_shape = [1]>(x, w)\n y = BatchNormalization(c, s, b, mu, var)",
        ),
    ],
)
def test_left_alone(graph_head, body):
    text = f"""
    <ir_version: 8, opset_import: ["" : 15]>
    g {graph_head} <{bn_params(3)}, float[3, 3, 1] w = {lit(np.eye(3))}> {{
      {body}
    }}
    """
    before, result = run(text)
    assert result.passes[0].rewrites == 0
    assert node_ops(result.model) == node_ops(before)


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
    body = result.model.graph.node(0).attributes["body"].value
    assert [n.op_type for n in body] == ["Identity", "Mul", "Add"]
    assert verify(before, result.model, rtol=1e-5, atol=1e-6).passed
