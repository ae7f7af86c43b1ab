"""merge-scale-chains: chains of constant Mul/Add/Sub/Div/Neg collapse into x·s + t."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops

from modelpress.passes import optimize
from modelpress.verify import verify

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
CONSTS = (
    "float a = {2.0}, float b = {3.0}, float c = {0.5}, float d = {-1.5}, "
    "float[3, 1] col = {1.0, -2.0, 4.0}, float[1, 4] row = {0.5, 1.0, 2.0, -1.0}, "
    "float[3, 1] col2 = {3.0, 0.25, -1.0}"
)


def run(body: str, *, inputs: str = "float[N, 3, 4] x", outputs: str = "float[N, 3, 4] y"):
    text = f"""
    {HEADER}
    g ({inputs}) => ({outputs}) <{CONSTS}> {{
      {body}
    }}
    """
    before = model_from_text(text)
    after = model_from_text(text)
    return before, optimize(after, passes=["merge-scale-chains", "dead-code"])


def consts(model, node):
    return [v.const_value.numpy() for v in node.inputs if v.const_value is not None]


def test_long_chain_becomes_one_mul_and_one_add():
    before, result = run("""
      m1 = Mul(x, a)
      m2 = Mul(b, m1)
      a1 = Add(m2, c)
      s1 = Sub(a1, d)
      dv = Div(s1, a)
      y = Add(dv, col)
    """)
    after = result.model
    assert node_ops(after) == ["Mul", "Add"]
    mul, add = after.graph.node(0), after.graph.node(1)
    assert (
        mul.inputs[0].name == "x" and add.inputs[0] is mul.outputs[0] and add.outputs[0].name == "y"
    )
    # ((x·2·3 + 0.5 + 1.5) / 2) + col = x·3 + (1 + col)
    np.testing.assert_allclose(consts(after, mul)[0], 3.0)
    np.testing.assert_allclose(consts(after, add)[0], [[2.0], [-1.0], [5.0]])
    assert verify(before, after, dims={"N": 2}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "body, ops",
    [
        ("t = Add(x, col)\n y = Mul(t, col2)", ["Mul", "Add"]),  # (x+a)·b → x·b + a·b
        ("t = Add(x, c)\n y = Neg(t)", ["Sub"]),  # -(x + c) → (-c) - x
        ("t = Neg(x)\n y = Neg(t)", ["Mul"]),  # cancels out; one Mul keeps the shape rule simple
        ("t = Sub(c, x)\n y = Mul(t, a)", ["Mul", "Add"]),  # (c - x)·a → x·(-a) + c·a
        ("t = Div(x, col)\n y = Div(t, col2)", ["Mul"]),
        ("t = Add(x, row)\n y = Add(t, c)", ["Add"]),
    ],
)
def test_shapes_of_chains(body, ops):
    before, result = run(body)
    assert node_ops(result.model) == ops
    assert result.model.graph.outputs[0].name == "y"
    assert verify(before, result.model, dims={"N": 3}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "body, outputs, why",
    [
        ("m = Mul(x, a)\n y = Add(m, c)", "float[N, 3, 4] y", "already x·s + t"),
        (
            "m = Mul(x, a)\n y = Mul(m, b)\n z = Relu(m)",
            "float[N, 3, 4] y, float[N, 3, 4] z",
            "m is read twice",
        ),
        (
            "m = Mul(x, a)\n y = Mul(m, b)\n z = Identity(m)",
            "float[N, 3, 4] y, float[N, 3, 4] z",
            "m has another reader",
        ),
        (
            "m = Mul(x, col)\n y = Mul(m, row)",
            "float[N, 3, 4] y",
            "(3,1)·(1,4) would make a bigger constant",
        ),
        ("m = Div(x, a)\n y = Div(c, m)", "float[N, 3, 4] y", "c / v is not affine"),
    ],
)
def test_left_alone(body, outputs, why):
    before, result = run(body, outputs=outputs)
    assert result.passes[0].rewrites == 0, why
    assert node_ops(result.model) == node_ops(before)


def test_intermediate_graph_output_is_kept():
    before, result = run(
        "m = Mul(x, a)\n y = Mul(m, b)", outputs="float[N, 3, 4] y, float[N, 3, 4] m"
    )
    assert result.passes[0].rewrites == 0


def test_integer_chains_are_left_alone():
    text = f"""
    {HEADER}
    g (int64[4] x) => (int64[4] y) <int64 two = {{2}}, int64 three = {{3}}> {{
      m = Div(x, two)
      y = Div(m, three)
    }}
    """
    model = model_from_text(text)
    result = optimize(model, passes=["merge-scale-chains"])
    assert result.rewrites == 0


def test_chain_inside_if_branch_and_dynamic_dims_stay():
    text = f"""
    {HEADER}
    g (bool k, float[N, M] x) => (float[N, M] y) <float a = {{2.0}}, float b = {{3.0}}> {{
      y = If(k) <then_branch = g1 () => (float[N, M] t) {{ p = Mul(x, a)  t = Mul(p, b) }},
                 else_branch = g2 () => (float[N, M] e) {{ e = Neg(x) }}>
    }}
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["merge-scale-chains"])
    branch = result.model.graph.node(0).attributes["then_branch"].value
    assert [n.op_type for n in branch] == ["Mul"]
    assert [str(d) for d in result.model.graph.outputs[0].shape] == ["N", "M"]
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    for k in (True, False):
        assert verify(
            before, result.model, inputs={"k": np.array(k), "x": x}, rtol=1e-6, atol=1e-6
        ).passed
