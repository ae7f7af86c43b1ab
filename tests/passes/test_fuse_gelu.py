"""fuse-gelu: Erf/Tanh GELU patterns → Gelu (opset >= 20); hard-swish patterns → HardSwish (>= 14)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from mp_testing import assert_graph_equal, model_from_text, node_ops, refusals

from modelpress.ir import from_proto
from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-gelu", "dead-code"]

HEADER = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[N, 16] x) => (float[N, 16] y)
<float half = {{0.5}}, float one = {{1}}, float two = {{2}}, float sqrt2 = {{1.4142135}}, float rsqrt2 = {{0.70710678}},
 float[1] c3 = {{3}}, float three = {{3}}, float six = {{6}}, float sixth = {{0.16666667}}, float zero = {{0}},
 float k = {{0.7978846}}, float a = {{0.044715}}> {{
  {body}
}}
"""


def run(body: str, opset: int):
    text = HEADER.format(opset=opset, body=body)
    before = model_from_text(text)
    return before, optimize(model_from_text(text), passes=PASSES)


def fused(op: str, opset: int) -> str:
    """The expected graph: the whole pattern is one ``op`` node, its constants gone."""
    return f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g (float[N, 16] x) => (float[N, 16] y) {{
      y = {op}(x)
    }}
    """


def check(before, after, rtol=1e-5):
    # inputs over a wide range, so both tails and the curved middle of GELU are exercised
    x = np.linspace(-8, 8, 6 * 16, dtype=np.float32).reshape(6, 16)
    result = verify(before, after, data={"x": x}, rtol=rtol, atol=1e-6)
    assert result.passed, result.to_dict()


ERF_FORMS = [
    "t = Div(x, sqrt2)\n e = Erf(t)\n p = Add(e, one)\n m = Mul(x, p)\n y = Mul(m, half)",  # PyTorch
    "t = Mul(rsqrt2, x)\n e = Erf(t)\n p = Add(one, e)\n m = Mul(p, x)\n y = Div(m, two)",
    "t = Div(x, sqrt2)\n e = Erf(t)\n p = Add(e, one)\n h = Mul(x, half)\n y = Mul(h, p)",
    "t = Div(x, sqrt2)\n e = Erf(t)\n p = Add(e, one)\n h = Mul(half, p)\n y = Mul(x, h)",
    # ONNX's own Gelu function body (after constant folding): Sum instead of Add
    "t = Div(x, sqrt2)\n e = Erf(t)\n p = Sum(one, e)\n h = Mul(half, x)\n y = Mul(h, p)",
]
TANH_FORMS = [
    # PyTorch's nn.GELU(approximate="tanh") at opset 11/12
    "s = Mul(x, x)\n c = Mul(x, s)\n t3 = Mul(a, c)\n i = Add(x, t3)\n o = Mul(k, i)\n th = Tanh(o)\n"
    " p = Add(one, th)\n m = Mul(x, p)\n y = Mul(half, m)",
    "c = Pow(x, three)\n t3 = Mul(c, a)\n i = Add(t3, x)\n o = Mul(i, k)\n th = Tanh(o)\n"
    " p = Add(th, one)\n h = Mul(x, half)\n y = Mul(h, p)",
]


@pytest.mark.parametrize("body", ERF_FORMS)
def test_erf_gelu(body):
    before, result = run(body, 20)
    assert_graph_equal(result.model, fused("Gelu", 20))
    check(before, result.model)


@pytest.mark.parametrize("body", TANH_FORMS)
def test_tanh_gelu(body):
    before, result = run(body, 20)
    assert_graph_equal(result.model, fused('Gelu<approximate = "tanh">', 20))
    check(before, result.model)


HARDSWISH_FORMS = [
    "h = HardSigmoid <alpha = 0.16666667> (x)\n y = Mul(x, h)",  # PyTorch's nn.Hardswish before opset 14
    "s = Add(x, three)\n c = Clip(s, zero, six)\n d = Div(c, six)\n y = Mul(x, d)",
    "s = Add(three, x)\n c = Clip(s, zero, six)\n m = Mul(c, x)\n y = Mul(m, sixth)",
    "s = Add(x, c3)\n c = Clip(s, zero, six)\n m = Mul(x, c)\n y = Div(m, six)",
]


@pytest.mark.parametrize("body", HARDSWISH_FORMS)
def test_hardswish(body):
    before, result = run(body, 14)
    assert_graph_equal(result.model, fused("HardSwish", 14))
    check(before, result.model)


@pytest.mark.parametrize(
    "why, body, opset, reasons",
    [
        (
            "Gelu needs opset 20",
            ERF_FORMS[0],
            19,
            ["opset 19 has no Gelu (from 20; optimize(opset=20) upgrades)"],
        ),
        (
            "HardSwish needs opset 14",
            HARDSWISH_FORMS[0],
            13,
            ["opset 13 has no HardSwish (from 14; optimize(opset=14) upgrades)"],
        ),
        # not the pattern: nothing is refused, there is nothing to rewrite
        (
            "wrong constant (1/2 vs 1/√2)",
            ERF_FORMS[0].replace("Div(x, sqrt2)", "Div(x, two)"),
            20,
            [],
        ),
        ("wrong cube coefficient", TANH_FORMS[0].replace("Mul(a, c)", "Mul(half, c)"), 20, []),
        ("HardSigmoid with the default alpha 0.2", "h = HardSigmoid(x)\n y = Mul(x, h)", 14, []),
        (
            "Clip to 0..6 without the shift by 3",
            "c = Clip(x, zero, six)\n d = Div(c, six)\n y = Mul(x, d)",
            14,
            [],
        ),
        ("swish stays", "s = Sigmoid(x)\n y = Mul(x, s)", 20, []),
    ],
)
def test_must_not_fire(why, body, opset, reasons):
    text = HEADER.format(opset=opset, body=body)
    model = model_from_text(text)
    assert refusals(model, "fuse-gelu") == reasons, why
    assert_graph_equal(model, text)


def test_intermediate_read_twice_blocks_fusion():
    body = ERF_FORMS[0] + "\n z = Identity(e)"
    text = HEADER.format(opset=20, body=body).replace(
        "=> (float[N, 16] y)", "=> (float[N, 16] y, float[N, 16] z)"
    )
    model = model_from_text(text)
    assert refusals(model, "fuse-gelu") == []
    assert_graph_equal(model, text)


def _export(module, opset: int) -> bytes:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.onnx.export(
        module.eval(),
        (torch.randn(3, 16),),
        buf,
        opset_version=opset,
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}},
    )
    return buf.getvalue()


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_exported_gelu_and_hardswish():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16),
        torch.nn.GELU(),
        torch.nn.Linear(16, 16),
        torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(16, 16),
        torch.nn.Hardswish(),
    )
    data = _export(model, 11)
    original = from_proto(onnx.load_from_string(data))
    result = optimize(from_proto(onnx.load_from_string(data)), opset=20, passes=PASSES)
    ops = node_ops(result.model)
    assert ops.count("Gelu") == 2 and ops.count("HardSwish") == 1
    assert not {"Erf", "Tanh", "HardSigmoid"} & set(ops)
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32) * 3
    out = verify(original, result.model, data={"x": x}, rtol=1e-5, atol=1e-6)
    assert out.passed, out.to_dict()
    # At the exported opset 11 nothing fires; at 14 only hard-swish does.
    assert optimize(from_proto(onnx.load_from_string(data)), passes=PASSES).rewrites == 0
    assert (
        optimize(from_proto(onnx.load_from_string(data)), opset=14, passes=PASSES)
        .passes[0]
        .rewrites
        == 1
    )


def test_integer_relu6_pattern_is_not_hardswish():
    # With integers Div truncates: x * clip(x + 3, 0, 6) / 6 is not hard-swish.
    text = """
    <ir_version: 10, opset_import: ["" : 14]>
    g (int32[N, 4] x) => (int32[N, 4] y) <int32 three = {3}, int32 zero = {0}, int32 six = {6}> {
      s = Add(x, three)
      c = Clip(s, zero, six)
      m = Mul(x, c)
      y = Div(m, six)
    }
    """
    model = model_from_text(text)
    assert refusals(model, "fuse-gelu") == []
    assert_graph_equal(model, text)
