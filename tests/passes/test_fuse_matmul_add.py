"""fuse-matmul-add: MatMul(x 2-D, W 2-D) + constant bias → Gemm."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, init, model_from_text, node_ops, refusals

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-matmul-add", "dead-code"]


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def text(
    rng,
    *,
    x="N, 6",
    y="N, 4",
    bias_shape=(4,),
    body="m = MatMul(x, W)\n y = Add(m, b)",
    wshape=(6, 4),
    opset=13,
):
    btype = f"float[{','.join(map(str, bias_shape))}]" if bias_shape else "float"
    return f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[{x}] x) => (float[{y}] y)
    <float[{",".join(map(str, wshape))}] W = {lit(rng.standard_normal(wshape))}, {btype} b = {lit(rng.standard_normal(bias_shape))}> {{
      {body}
    }}
    """


def run(t: str):
    before = model_from_text(t)
    return before, optimize(model_from_text(t), passes=PASSES)


@pytest.mark.parametrize(
    "bias_shape, body",
    [
        ((4,), "m = MatMul(x, W)\n y = Add(m, b)"),
        ((1, 4), "m = MatMul(x, W)\n y = Add(b, m)"),
        ((), "m = MatMul(x, W)\n y = Add(m, b)"),
        (
            (4,),
            "m = MatMul(x, W)\n c = Constant <value = float[4] {1, 2, 3, 4}> ()\n y = Add(m, c)",
        ),
    ],
)
def test_becomes_gemm(rng, bias_shape, body):
    before, result = run(text(rng, bias_shape=bias_shape, body=body))
    g = before.graph
    w = g.initializers["W"].const_value.numpy()
    bias = (
        np.array([1, 2, 3, 4], np.float32)
        if "Constant" in body
        else g.initializers["b"].const_value.numpy()
    )
    gemm_bias = f"b = Constant <value = {init('v', bias)}> ()\n" if "Constant" in body else ""
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 6] x) => (float[N, 4] y) <{init("W", w)}{"" if gemm_bias else ", " + init("b", bias)}> {{
          {gemm_bias}y = Gemm(x, W, b)
        }}
        """,
    )
    check = verify(before, result.model, dims={"N": 5}, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


def test_transposed_weight_becomes_trans_b(rng):
    body = "wt = Transpose <perm = [1, 0]> (W)\n m = MatMul(x, wt)\n y = Add(m, b)"
    t = text(rng, body=body, wshape=(4, 6))
    before, result = run(t)
    assert_graph_equal(
        result.model,
        t.replace(body, "y = Gemm <transB = 1> (x, W, b)"),
    )
    assert result.model.graph.node(0).inputs[1].name == "W"
    check = verify(before, result.model, dims={"N": 3}, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "reason, kwargs",
    [
        ("the input is not known to be 2-D: Gemm takes a 2-D A", {"x": "2, 3, 6", "y": "2, 3, 4"}),
        (
            "the bias, shaped (5, 1), does not broadcast along the last axis only",
            {"bias_shape": (5, 1), "x": "5, 6", "y": "5, 4"},
        ),
        (
            "the MatMul output has other readers or is a graph output: Gemm yields only product + bias",
            {"body": "m = MatMul(x, W)\n y = Add(m, b)\n m2 = Identity(m)"},
        ),
    ],
)
def test_must_not_fire(rng, reason, kwargs):
    t = text(rng, **kwargs)
    if "m2" in t:
        t = t.replace("=> (float[N, 4] y)", "=> (float[N, 4] y, float[N, 4] m2)")
    model = model_from_text(t)
    assert refusals(model, "fuse-matmul-add") == [reason]
    assert_graph_equal(model, t)


def test_non_constant_bias_is_kept(rng):
    t = (
        text(rng)
        .replace("(float[N, 6] x)", "(float[N, 6] x, float[4] b)")
        .replace(", float[4] b = ", ", float[4] unused = ")
    )
    _, result = run(t)
    assert node_ops(result.model) == ["MatMul", "Add"]
    assert refusals(model_from_text(t), "fuse-matmul-add") == ["the bias is not a constant"]


def test_before_opset_7_nothing_is_fused(rng):
    t = text(rng, opset=6)
    model = model_from_text(t)
    assert refusals(model, "fuse-matmul-add") == [
        "opset < 7: Gemm's broadcast of C starts at opset 7"
    ]
    assert_graph_equal(model, t)


def test_inside_if_branch_keeps_names_unique(rng):
    w, b = lit(rng.standard_normal((6, 4))), lit(rng.standard_normal(4))
    t = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (bool cond, float[3, 6] x) => (float[3, 4] y, float[3, 4] y2) <float[6, 4] W = {w}, float[4] b = {b}> {{
      m0 = MatMul(x, W)
      y2 = Add(m0, b)
      y = If(cond) <then_branch = t () => (float[3, 4] a) {{
                        m = MatMul(x, W)
                        s = Add(m, b)
                        a = Relu(s)
                     }},
                     else_branch = e () => (float[3, 4] z) {{ z = Identity(y2) }}>
    }}
    """
    before, result = run(t)
    assert result.passes[0].rewrites == 2
    assert_graph_equal(
        result.model,
        t.replace("m0 = MatMul(x, W)\n      y2 = Add(m0, b)", "y2 = Gemm(x, W, b)").replace(
            "m = MatMul(x, W)\n                        s = Add(m, b)", "s = Gemm(x, W, b)"
        ),
    )
    x = rng.standard_normal((3, 6)).astype(np.float32)
    for cond in (True, False):
        check = verify(
            before, result.model, data={"cond": np.array(cond), "x": x}, rtol=1e-6, atol=1e-6
        )
        assert check.passed, check.to_dict()
