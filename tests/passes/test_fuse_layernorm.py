"""fuse-layernorm: the primitive ReduceMean/Sub/Pow/... pattern → LayerNormalization (opset >= 17)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from mp_testing import model_from_text, node_ops

from modelpress.ir import from_proto
from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-layernorm", "dead-code"]
H = 8


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


RNG = np.random.default_rng(3)
GAMMA, BETA = lit(RNG.uniform(0.5, 1.5, H)), lit(RNG.standard_normal(H))

# The graph PyTorch's exporter writes for nn.LayerNorm at opset 11/12, with the axes as an
# attribute; {axes} and {square}/{norm} vary the arrangement.
PATTERN = """
<ir_version: 8, opset_import: ["" : {opset}]>
g (float[B, S, {h}] x) => (float[B, S, {h}] y)
<float[{h}] gamma = {gamma}, float[{h}] beta = {beta}, float two = {{2}}, float eps = {{1e-5}}{inits}> {{
  m = ReduceMean {axes} (x)
  d = Sub(x, m)
  {square}
  v = ReduceMean {axes} (q)
  ve = Add(v, eps)
  s = Sqrt(ve)
  {norm}
  {tail}
}}
"""

DEFAULTS = dict(
    opset=17,
    h=H,
    gamma=GAMMA,
    beta=BETA,
    inits="",
    axes="<axes = [-1]>",
    square="q = Pow(d, two)",
    norm="n = Div(d, s)",
    tail="gm = Mul(n, gamma)\n  y = Add(gm, beta)",
)


def pattern(**kw) -> str:
    return PATTERN.format(**{**DEFAULTS, **kw})


def run(text: str, **kw):
    before = model_from_text(text)
    return before, optimize(model_from_text(text), passes=PASSES, **kw)


def check(before, after):
    result = verify(before, after, dims={"B": 2, "S": 5}, rtol=1e-5, atol=1e-5)
    assert result.passed, result.to_dict()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"square": "q = Mul(d, d)"},
        {"norm": "r = Reciprocal(s)\n  n = Mul(d, r)"},
        {"norm": "one = Constant <value = float {1}> ()\n  r = Div(one, s)\n  n = Mul(r, d)"},
        {"tail": "gm = Mul(gamma, n)\n  y = Add(beta, gm)"},
        {"tail": "y = Mul(n, gamma)"},  # no beta
        {"tail": "y = Identity(n)"},  # neither
        {"axes": "<axes = [2]>"},  # positive axis, rank known from x
    ],
)
def test_fuses(kw):
    before, result = run(pattern(**kw))
    ops = [op for op in node_ops(result.model) if op != "Constant"]
    assert ops[0] == "LayerNormalization" and ops[1:] in ([], ["Identity"])
    ln = result.model.graph.node(0) if node_ops(result.model)[0] != "Constant" else result.model.graph.node(1)
    assert ln.attributes["axis"].value == -1
    assert abs(ln.attributes["epsilon"].value - 1e-5) < 1e-12
    check(before, result.model)


def test_two_trailing_axes():
    text = pattern(axes="<axes = [-2, -1]>").replace("float[B, S, 8] x", "float[B, 3, 8] x").replace("float[B, S, 8] y", "float[B, 3, 8] y")
    text = text.replace(f"float[{H}] gamma", "float[1, 8] gamma")
    before, result = run(text)
    assert node_ops(result.model) == ["LayerNormalization"]
    assert result.model.graph.node(0).attributes["axis"].value == -2
    check(before, result.model)


def test_opset18_axes_input():
    text = pattern(opset=18, axes="", inits=", int64[1] ax = {-1}").replace("ReduceMean  (x)", "ReduceMean(x, ax)").replace("ReduceMean  (q)", "ReduceMean(q, ax)")
    before, result = run(text)
    assert node_ops(result.model) == ["LayerNormalization"]
    check(before, result.model)


@pytest.mark.parametrize(
    "why, kw",
    [
        ("opset 16 has no LayerNormalization", {"opset": 16}),
        ("not the trailing axis", {"axes": "<axes = [1]>"}),
        ("keepdims=0", {"axes": "<axes = [-1], keepdims = 0>"}),
        ("cube instead of square", {"inits": ", float three = {3}", "square": "q = Pow(d, three)"}),
        ("the centred value is read a third time", {"tail": "gm = Mul(n, gamma)\n  y0 = Add(gm, beta)\n  y = Add(y0, d)"}),
    ],
)
def test_must_not_fire(why, kw):
    _, result = run(pattern(**kw))
    assert "LayerNormalization" not in node_ops(result.model), why
    assert result.passes[0].rewrites == 0


def test_variance_as_graph_output_blocks_fusion():
    text = pattern().replace("=> (float[B, S, 8] y)", "=> (float[B, S, 8] y, float[B, S, 1] v)")
    _, result = run(text)
    assert "LayerNormalization" not in node_ops(result.model)


def test_gamma_that_is_not_per_feature_is_left_unfused():
    # gamma of shape (S, 1) scales per position, not per feature: the Mul must stay.
    text = pattern().replace("float[B, S, 8] x", "float[B, 5, 8] x").replace(f"float[{H}] gamma = {GAMMA}", f"float[5, 1] gamma = {lit(np.arange(5))}")
    before, result = run(text)
    assert node_ops(result.model) == ["LayerNormalization", "Mul", "Add"]
    check(before, result.model)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("export_opset, target", [(11, 17), (12, 18)])
def test_torch_exported_layernorm(export_opset, target):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.ln = torch.nn.LayerNorm(16, eps=1e-6)
            with torch.no_grad():
                self.ln.weight.uniform_(0.5, 1.5)
                self.ln.bias.normal_()

        def forward(self, x):
            return self.ln(x + self.fc(x))

    buf = io.BytesIO()
    torch.onnx.export(
        Block().eval(), (torch.randn(2, 5, 16),), buf, opset_version=export_opset, dynamo=False,
        input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}},
    )
    original = from_proto(onnx.load_from_string(buf.getvalue()))
    assert "LayerNormalization" not in node_ops(original)
    result = optimize(from_proto(onnx.load_from_string(buf.getvalue())), opset=target, passes=PASSES)
    assert node_ops(result.model).count("LayerNormalization") == 1
    assert not {"ReduceMean", "Sqrt", "Pow"} & set(node_ops(result.model))
    out = verify(original, result.model, dims={"b": 2, "s": 7}, rtol=1e-5, atol=1e-5)
    assert out.passed, out.to_dict()
    # At the exported opset the pass must leave the pattern alone.
    same = optimize(from_proto(onnx.load_from_string(buf.getvalue())), passes=PASSES)
    assert "LayerNormalization" not in node_ops(same.model)
