"""merge-scale-chains: chains of constant Mul/Add/Sub/Div/Neg collapse into x·s + t."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, init, model_from_text, refusals

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


COL, ROW, COL2 = (
    np.array([[1.0], [-2.0], [4.0]]),
    np.array([[0.5, 1.0, 2.0, -1.0]]),
    np.array([[3.0], [0.25], [-1.0]]),
)


def expected(body: str, inits: list[str]) -> str:
    return f"""
    {HEADER}
    g (float[N, 3, 4] x) => (float[N, 3, 4] y) <{", ".join(inits)}> {{
      {body}
    }}
    """


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
    # ((x·2·3 + 0.5 + 1.5) / 2) + col = x·3 + (1 + col)
    assert_graph_equal(
        after,
        expected("m = Mul(x, s)\n y = Add(m, t)", [init("s", np.array(3.0)), init("t", 1 + COL)]),
    )
    assert verify(before, after, dims={"N": 2}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "body, want",
    [
        # (x+a)·b → x·b + a·b
        (
            "t = Add(x, col)\n y = Mul(t, col2)",
            ("m = Mul(x, s)\n y = Add(m, t)", [init("s", COL2), init("t", COL * COL2)]),
        ),
        # -(x + c) → (-c) - x
        ("t = Add(x, c)\n y = Neg(t)", ("y = Sub(t, x)", [init("t", np.array(-0.5))])),
        # cancels out; one Mul keeps the shape rule simple
        ("t = Neg(x)\n y = Neg(t)", ("y = Mul(x, s)", [init("s", np.array(1.0))])),
        # (c - x)·a → x·(-a) + c·a
        (
            "t = Sub(c, x)\n y = Mul(t, a)",
            (
                "m = Mul(x, s)\n y = Add(m, t)",
                [init("s", np.array(-2.0)), init("t", np.array(1.0))],
            ),
        ),
        ("t = Div(x, col)\n y = Div(t, col2)", ("y = Mul(x, s)", [init("s", 1 / (COL * COL2))])),
        ("t = Add(x, row)\n y = Add(t, c)", ("y = Add(x, t)", [init("t", ROW + 0.5)])),
    ],
)
def test_shapes_of_chains(body, want):
    before, result = run(body)
    assert_graph_equal(result.model, expected(*want))
    assert verify(before, result.model, dims={"N": 3}, rtol=1e-6, atol=1e-6).passed


@pytest.mark.parametrize(
    "body, outputs, reasons",
    [
        (
            "m = Mul(x, a)\n y = Add(m, c)",
            "float[N, 3, 4] y",
            ["Mul → Add saves no op over Mul → Add and reorders nothing"],
        ),
        # not the pattern (a chain whose intermediate has one reader): nothing to refuse
        ("m = Mul(x, a)\n y = Mul(m, b)\n z = Relu(m)", "float[N, 3, 4] y, float[N, 3, 4] z", []),
        (
            "m = Mul(x, a)\n y = Mul(m, b)\n z = Identity(m)",
            "float[N, 3, 4] y, float[N, 3, 4] z",
            [],
        ),
        (
            "m = Mul(x, a)\n y = Mul(m, b)",
            "float[N, 3, 4] y, float[N, 3, 4] m",
            [],
        ),  # m is an output
        ("m = Div(x, a)\n y = Div(c, m)", "float[N, 3, 4] y", []),  # c / v is not affine
        # (3,1)·(1,4) would make a bigger constant
        (
            "m = Mul(x, col)\n y = Mul(m, row)",
            "float[N, 3, 4] y",
            ["the merged constants would be larger than any of the originals"],
        ),
    ],
)
def test_left_alone(body, outputs, reasons):
    text = f"""
    {HEADER}
    g (float[N, 3, 4] x) => ({outputs}) <{CONSTS}> {{
      {body}
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "merge-scale-chains") == reasons
    assert_graph_equal(model, text)


def test_integer_chains_are_left_alone():
    text = f"""
    {HEADER}
    g (int64[4] x) => (int64[4] y) <int64 two = {{2}}, int64 three = {{3}}> {{
      m = Div(x, two)
      y = Div(m, three)
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "merge-scale-chains") == []  # integer Div is no link of a chain
    assert_graph_equal(model, text)


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
    assert_graph_equal(
        result.model,
        f"""
        {HEADER}
        g (bool k, float[N, M] x) => (float[N, M] y) <float a = {{2.0}}, float b = {{3.0}}> {{
          y = If(k) <then_branch = g1 () => (float[N, M] t) <float s = {{6.0}}> {{ t = Mul(x, s) }},
                     else_branch = g2 () => (float[N, M] e) {{ e = Neg(x) }}>
        }}
        """,
    )
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    for k in (True, False):
        assert verify(
            before, result.model, data={"k": np.array(k), "x": x}, rtol=1e-6, atol=1e-6
        ).passed
