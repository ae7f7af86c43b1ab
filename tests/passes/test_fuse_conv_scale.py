"""fuse-conv-scale: a constant per-channel Mul/Add/Sub/Div after a Conv folds into its weights."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-conv-scale", "dead-code"]


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def conv_then(rng, body: str, consts: dict[str, tuple[int, ...]], *, op="Conv", group=1, bias=True) -> str:
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
    before, result = run(conv_then(rng, body, consts))
    assert node_ops(result.model) == ["Conv"], body
    check = verify(before, result.model, rtol=1e-5, atol=1e-6)
    assert check.passed, check.to_dict()


def test_conv_without_bias_and_convtranspose_groups(rng):
    for op, group in (("Conv", 1), ("ConvTranspose", 2)):
        text = conv_then(rng, "m = Mul(c, k)\n y = Add(m, a)", {"k": (4, 1, 1), "a": (4, 1, 1)}, op=op, group=group, bias=False)
        before, result = run(text)
        assert node_ops(result.model) == [op]
        check = verify(before, result.model, rtol=1e-5, atol=1e-6)
        assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "why, body, consts, extra_out",
    [
        ("not per channel (spatial shape)", "y = Mul(c, k)", {"k": (4, 4, 4)}, ""),
        ("would broadcast to a higher rank", "y = Add(c, k)", {"k": (1, 1, 4, 1, 1)}, ""),
        ("conv output also a graph output", "y = Mul(c, k)", {"k": (4, 1, 1)}, ", float[2, 4, 4, 4] c"),
        ("c - y is not folded", "y = Sub(k, c)", {"k": (4, 1, 1)}, ""),
    ],
)
def test_must_not_fire(rng, why, body, consts, extra_out):
    text = conv_then(rng, body, consts)
    if extra_out:
        text = text.replace("float[2, 4, H, W] y)", f"float[2, 4, H, W] y{extra_out})")
    _, result = run(text)
    assert len(result.model.graph) == 2, why
    assert result.passes[0].rewrites == 0


def test_non_constant_operand_is_left(rng):
    text = conv_then(rng, "y = Mul(c, k)", {}).replace("(float[2, 3, 6, 6] x)", "(float[2, 3, 6, 6] x, float[4, 1, 1] k)")
    _, result = run(text)
    assert node_ops(result.model) == ["Conv", "Mul"]
