"""fuse-conv-scale: a constant per-channel Mul/Add/Sub/Div after a Conv folds into its weights."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, init, model_from_text, node_ops, refusals

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-conv-scale", "dead-code"]


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def conv_then(
    rng, body: str, consts: dict[str, tuple[int, ...]], *, op="Conv", group=1, bias=True
) -> str:
    wshape = (4, 3, 3, 3) if op == "Conv" else (4, 4 // group, 3, 3)
    cout = 4
    inits = [f"float[{','.join(map(str, wshape))}] Wt = {lit(rng.standard_normal(wshape))}"]
    if bias:
        inits.append(f"float[{cout}] B = {lit(rng.standard_normal(cout))}")
    for name, shape in consts.items():
        ty = f"float[{','.join(map(str, shape))}]" if shape else "float"
        inits.append(f"{ty} {name} = {lit(rng.uniform(0.5, 2.0, shape))}")
    cin = 3 if op == "Conv" else 4
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, {cin}, 6, 6] x) => (float[2, {cout}, H, W] y) <{", ".join(inits)}> {{
      c = {op} <group = {group}> (x, Wt{", B" if bias else ""})
      {body}
    }}
    """


def run(text: str):
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=PASSES)
    return before, result


@pytest.mark.parametrize(
    "body, consts",
    [
        ("y = Mul(c, k)", {"k": (4, 1, 1)}),
        ("y = Mul(k, c)", {"k": (1, 4, 1, 1)}),
        ("y = Add(c, k)", {"k": (4, 1, 1)}),
        ("y = Sub(c, k)", {"k": (1, 4, 1, 1)}),
        ("y = Div(c, k)", {"k": (4, 1, 1)}),
        ("y = Mul(c, k)", {"k": ()}),  # scalar
        ("y = Add(c, k)", {"k": (1,)}),  # one element
        ("m = Mul(c, k)\n y = Add(m, a)", {"k": (4, 1, 1), "a": (1, 4, 1, 1)}),
    ],
)
def test_folds_into_conv(rng, body, consts):
    text = conv_then(rng, body, consts)
    before, result = run(text)
    assert_graph_equal(result.model, expected_conv(before, body), atol=1e-6)
    check = verify(before, result.model, rtol=1e-5, atol=1e-6)
    assert check.passed, check.to_dict()


def expected_conv(before, body: str, *, op="Conv", group=1, bias=True) -> str:
    """The one Conv the chain in ``body`` folds into, its weight and bias by the formula."""
    g = before.graph
    w = g.initializers["Wt"].const_value.numpy().astype(np.float64)
    b = g.initializers["B"].const_value.numpy().astype(np.float64) if bias else np.zeros(4)
    s, t = np.ones(4), np.zeros(4)
    for line in body.split("\n"):
        kind, operands = line.split("=")[1].strip().rstrip(")").split("(")
        name = next(n.strip() for n in operands.split(",") if n.strip() in g.initializers)
        k = np.broadcast_to(
            g.initializers[name].const_value.numpy().astype(np.float64).reshape(-1), (4,)
        )
        if kind == "Mul":
            s, t = s * k, t * k
        elif kind == "Div":
            s, t = s / k, t / k
        else:
            t = t + k if kind == "Add" else t - k
    folded = w.copy()
    for m in range(4):  # output channel m: W[m] (Conv); its group's rows, column j (ConvTranspose)
        if op == "Conv":
            folded[m] *= s[m]
        else:
            g_, j = divmod(m, 4 // group)
            folded[g_ * 4 // group : (g_ + 1) * 4 // group, j] *= s[m]
    cin = 3 if op == "Conv" else 4
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, {cin}, 6, 6] x) => (float[2, 4, H, W] y) <{init("W", folded)}, {init("B", b * s + t)}> {{
      y = {op} <group = {group}> (x, W, B)
    }}
    """


def test_conv_without_bias_and_convtranspose_groups(rng):
    body = "m = Mul(c, k)\n y = Add(m, a)"
    for op, group in (("Conv", 1), ("ConvTranspose", 2)):
        text = conv_then(
            rng, body, {"k": (4, 1, 1), "a": (4, 1, 1)}, op=op, group=group, bias=False
        )
        before, result = run(text)
        assert_graph_equal(
            result.model, expected_conv(before, body, op=op, group=group, bias=False), atol=1e-6
        )
        check = verify(before, result.model, rtol=1e-5, atol=1e-6)
        assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "reason, body, consts, extra_out",
    [
        (
            "the constant, shaped (4, 4, 4), is not per output channel of a rank-4 output",
            "y = Mul(c, k)",
            {"k": (4, 4, 4)},
            "",
        ),
        (
            "the constant, shaped (1, 1, 4, 1, 1), is not per output channel of a rank-4 output",
            "y = Add(c, k)",
            {"k": (1, 1, 4, 1, 1)},
            "",
        ),
        (
            "the Conv output has other readers or is a graph output",
            "y = Mul(c, k)",
            {"k": (4, 1, 1)},
            ", float[2, 4, 4, 4] c",
        ),
        (None, "y = Sub(k, c)", {"k": (4, 1, 1)}, ""),  # c - y is not the pattern
    ],
)
def test_must_not_fire(rng, reason, body, consts, extra_out):
    text = conv_then(rng, body, consts)
    if extra_out:
        text = text.replace("float[2, 4, H, W] y)", f"float[2, 4, H, W] y{extra_out})")
    model = model_from_text(text)
    assert refusals(model, "fuse-conv-scale") == ([reason] if reason else [])
    assert_graph_equal(model, text)


def test_non_constant_operand_is_left(rng):
    text = conv_then(rng, "y = Mul(c, k)", {}).replace(
        "(float[2, 3, 6, 6] x)", "(float[2, 3, 6, 6] x, float[4, 1, 1] k)"
    )
    _, result = run(text)
    assert node_ops(result.model) == ["Conv", "Mul"]
    assert refusals(model_from_text(text), "fuse-conv-scale") == [
        "the other operand is not a constant"
    ]


def test_division_by_zero_is_left_to_run_time(rng):
    text = conv_then(rng, "y = Div(c, k)", {"k": (4, 1, 1)})
    text = text.replace(
        text[text.index("float[4,1,1] k") : text.index("}", text.index("float[4,1,1] k")) + 1],
        "float[4,1,1] k = {1.0, 0.0, 2.0, 1.0}",
    )
    model = model_from_text(text)
    assert refusals(model, "fuse-conv-scale") == ["the constant is not finite, or divides by zero"]
    assert_graph_equal(model, text)
