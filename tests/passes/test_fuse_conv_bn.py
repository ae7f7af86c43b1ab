"""fuse-conv-bn: BatchNormalization folded into Conv / ConvTranspose / Gemm / MatMul."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mp_testing import assert_graph_equal, init, model_from_text, refusals

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-conv-bn", "dead-code"]


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def bn_params(rng, c: int) -> str:
    scale, bias, mean = rng.standard_normal((3, c))
    var = rng.uniform(0.2, 2.0, c)
    return (
        f"float[{c}] s = {lit(scale)}, float[{c}] b = {lit(bias)}, "
        f"float[{c}] mu = {lit(mean)}, float[{c}] var = {lit(var)}"
    )


def conv_bn(rng, *, op="Conv", group=1, cin=4, cout=6, bias=True, extra="", opset=17):
    if op == "Conv":
        wshape = (cout, cin // group, 3, 3)
    else:
        wshape = (cin, cout // group, 3, 3)
    w = rng.standard_normal(wshape)
    b_init = f", float[{cout}] B = {lit(rng.standard_normal(cout))}" if bias else ""
    b_in = ", B" if bias else ""
    return f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, {cin}, 7, 7] x) => (float[2, {cout}, H, W] y)
    <float[{",".join(map(str, wshape))}] Wt = {lit(w)}{b_init}, {bn_params(rng, cout)}> {{
      c = {op} <group = {group}, pads = [1, 1, 1, 1]> (x, Wt{b_in})
      y = BatchNormalization <epsilon = 0.001> (c, s, b, mu, var)
      {extra}
    }}
    """


def fused(text: str):
    before = model_from_text(text)
    after = model_from_text(text)
    result = optimize(after, passes=PASSES)
    return before, result


@pytest.mark.parametrize(
    "op, group, cin, cout, bias",
    [
        ("Conv", 1, 4, 6, True),
        ("Conv", 1, 4, 6, False),
        ("Conv", 2, 4, 6, True),
        ("Conv", 4, 4, 4, True),  # depthwise
        ("ConvTranspose", 1, 4, 6, True),
        ("ConvTranspose", 2, 4, 6, False),
        ("ConvTranspose", 4, 4, 8, True),  # 4 groups, 2 output channels each
    ],
)
def test_conv_bn_folds_and_matches(rng, op, group, cin, cout, bias):
    before, result = fused(conv_bn(rng, op=op, group=group, cin=cin, cout=cout, bias=bias))
    assert result.passes[0].rewrites == 1
    w = before.graph.initializers["Wt"].const_value.numpy().astype(np.float64)
    b = (
        before.graph.initializers["B"].const_value.numpy().astype(np.float64)
        if bias
        else np.zeros(cout)
    )
    k, t = bn_affine(before)
    folded = w.copy()
    for m in range(
        cout
    ):  # output channel m: W[m] (Conv); its group's rows, column j (ConvTranspose)
        if op == "Conv":
            folded[m] *= k[m]
        else:
            per_group = cout // group
            g, j = divmod(m, per_group)
            folded[g * cin // group : (g + 1) * cin // group, j] *= k[m]
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, {cin}, 7, 7] x) => (float[2, {cout}, H, W] y) <{init("W", folded)}, {init("B", b * k + t)}> {{
          y = {op} <group = {group}, pads = [1, 1, 1, 1]> (x, W, B)
        }}
        """,
    )
    check = verify(before, result.model, rtol=1e-5, atol=1e-6)
    assert check.passed, check.to_dict()
    assert result.model.graph.outputs[0].name == "y"


def bn_affine(model, name_eps=1e-3):
    """The BatchNormalization's scale and shift by its formula, from the model's constants."""
    g = model.graph
    scale, bias, mean, var = (
        g.initializers[n].const_value.numpy().astype(np.float64) for n in ("s", "b", "mu", "var")
    )
    k = scale / np.sqrt(var + name_eps)
    return k, bias - mean * k


def test_folded_weights_match_formula(rng):
    before, result = fused(conv_bn(rng))
    g = before.graph
    w = g.initializers["Wt"].const_value.numpy().astype(np.float64)
    b0 = g.initializers["B"].const_value.numpy().astype(np.float64)
    k, t = bn_affine(before)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 4, 7, 7] x) => (float[2, 6, H, W] y)
        <{init("W", w * k[:, None, None, None])}, {init("B", b0 * k + t)}> {{
          y = Conv <group = 1, pads = [1, 1, 1, 1]> (x, W, B)
        }}
        """,
    )


def as_float16(model):
    """The model with every float tensor (initializers, inputs, outputs) turned into float16."""
    for v in model.graph.initializers.values():
        v.const_value = ir.tensor(v.const_value.numpy().astype(np.float16), name=v.name)
    for v in [*model.graph.initializers.values(), *model.graph.inputs, *model.graph.outputs]:
        v.type = ir.TensorType(ir.DataType.FLOAT16)
    return model


def test_float16_keeps_dtype(rng):
    text = conv_bn(rng)
    before = as_float16(model_from_text(text))
    result = optimize(as_float16(model_from_text(text)), passes=PASSES)
    conv = result.model.graph.node(0)
    assert conv.inputs[1].const_value.numpy().dtype == np.float16
    check = verify(before, result.model, rtol=5e-3, atol=5e-3)
    assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "reason, edit",
    [
        (
            "the Conv output has other readers or is a graph output",
            lambda t: t.replace(
                "=> (float[2, 6, H, W] y)", "=> (float[2, 6, H, W] y, float[2, 6, H, W] c)"
            ),
        ),
        (
            "training mode: it normalizes with the batch's own statistics",
            lambda t: (
                t.replace("epsilon = 0.001", "epsilon = 0.001, training_mode = 1")
                .replace("float[2, 6, H, W] y)", "float[2, 6, H, W] y, float[6] rm, float[6] rv)")
                .replace("y = Batch", "y, rm, rv = Batch")
            ),
        ),
        (
            "scale, bias, mean and variance are not all constant 1-D floats",
            lambda t: t.replace(
                "(float[2, 4, 7, 7] x)", "(float[2, 4, 7, 7] x, float[6] v2)"
            ).replace("mu, var)", "mu, v2)"),
        ),
    ],
)
def test_must_not_fire(rng, reason, edit):
    text = edit(conv_bn(rng))
    model = model_from_text(text)
    assert refusals(model, "fuse-conv-bn") == [reason]
    assert_graph_equal(model, text)


def test_bn_before_opset_7_needs_is_test(rng):
    text = conv_bn(rng, opset=6).replace("epsilon = 0.001", "epsilon = 0.001, is_test = 0")
    _, result = fused(text)
    assert result.passes[0].rewrites == 0
    assert refusals(model_from_text(text), "fuse-conv-bn") == [
        "training mode (is_test=0): it normalizes with the batch's own statistics"
    ]


def gemm_bn(rng, *, trans_b: int, with_c: bool, beta: float = 1.0) -> str:
    w = rng.standard_normal((5, 3) if trans_b else (3, 5))
    c_init = f", float[5] C = {lit(rng.standard_normal(5))}" if with_c else ""
    c_in = ", C" if with_c else ""
    return f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3] x) => (float[N, 5] y)
    <float[{",".join(map(str, w.shape))}] Wt = {lit(w)}{c_init}, {bn_params(rng, 5)}> {{
      h = Gemm <transB = {trans_b}, alpha = 0.5, beta = {beta}> (x, Wt{c_in})
      y = BatchNormalization (h, s, b, mu, var)
    }}
    """


@pytest.mark.parametrize("trans_b, with_c, beta", [(0, True, 2.0), (1, True, 1.0), (1, False, 1.0)])
def test_gemm_bn(rng, trans_b, with_c, beta):
    text = gemm_bn(rng, trans_b=trans_b, with_c=with_c, beta=beta)
    before, result = fused(text)
    w = before.graph.initializers["Wt"].const_value.numpy().astype(np.float64)
    c = before.graph.initializers["C"].const_value.numpy().astype(np.float64) if with_c else 0.0
    k, t = bn_affine(before, 1e-5)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 3] x) => (float[N, 5] y)
        <{init("W", w * (k[:, None] if trans_b else k[None, :]))}, {init("C", beta * c * k + t)}> {{
          y = Gemm <transB = {trans_b}, alpha = 0.5, beta = 1.0> (x, W, C)
        }}
        """,
    )
    check = verify(before, result.model, rtol=1e-5, atol=1e-6, dims={"N": 4})
    assert check.passed, check.to_dict()


MATMUL_BN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[{xs}] x) => (float[{ys}] y) <float[3, 5] Wt = {w}, {bn}> {{
  h = MatMul(x, Wt)
  y = BatchNormalization (h, s, b, mu, var)
}}
"""


def test_matmul_bn_rank2_becomes_gemm(rng):
    text = MATMUL_BN.format(
        xs="N, 3", ys="N, 5", w=lit(rng.standard_normal((3, 5))), bn=bn_params(rng, 5)
    )
    before, result = fused(text)
    w = before.graph.initializers["Wt"].const_value.numpy().astype(np.float64)
    k, t = bn_affine(before, 1e-5)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 3] x) => (float[N, 5] y) <{init("W", w * k[None, :])}, {init("C", t)}> {{
          y = Gemm (x, W, C)
        }}
        """,
    )
    check = verify(before, result.model, rtol=1e-5, atol=1e-6, dims={"N": 4})
    assert check.passed, check.to_dict()


def test_matmul_bn_rank3_is_left_alone(rng):
    # BatchNormalization normalizes axis 1 of (N, 5, 5): that axis is not W's column axis.
    text = MATMUL_BN.format(
        xs="2, 5, 3", ys="2, 5, 5", w=lit(rng.standard_normal((3, 5))), bn=bn_params(rng, 5)
    )
    model = model_from_text(text)
    assert refusals(model, "fuse-conv-bn") == [
        "the MatMul's input is not known to be 2-D: channel axis 1 is not W's column axis"
    ]
    assert_graph_equal(model, text)


def test_bn_in_if_branch_is_fused(rng):
    w = rng.standard_normal((2, 2, 1, 1))
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool cond, float[1, 2, 3, 3] x) => (float[1, 2, 3, 3] y)
    <float[2, 2, 1, 1] Wt = {lit(w)}, {bn_params(rng, 2)}> {{
      y = If(cond) <then_branch = t () => (float[1, 2, 3, 3] a) {{
                        c = Conv(x, Wt)
                        a = BatchNormalization(c, s, b, mu, var)
                     }},
                     else_branch = e () => (float[1, 2, 3, 3] z) {{ z = Relu(x) }}>
    }}
    """
    before, result = fused(text)
    then = result.model.graph.node(0).attributes["then_branch"].value
    assert [n.op_type for n in then] == ["Conv"]
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    check = verify(
        before, result.model, data={"cond": np.array(True), "x": x}, rtol=1e-5, atol=1e-6
    )
    assert check.passed, check.to_dict()
