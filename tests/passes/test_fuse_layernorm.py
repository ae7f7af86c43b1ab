"""fuse-layernorm: the primitive ReduceMean/Sub/Pow/... pattern → LayerNormalization (opset >= 17)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from mp_testing import assert_graph_equal, model_from_text, node_ops, refusals

from modelpress.ir import from_proto
from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-layernorm", "dead-code"]
H = 8


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


RNG = np.random.default_rng(3)
GAMMA_VALUES, BETA_VALUES = RNG.uniform(0.5, 1.5, H), RNG.standard_normal(H)
GAMMA, BETA = lit(GAMMA_VALUES), lit(BETA_VALUES)

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


def expected(body: str, inits: str, *, opset: int = 17, x: str = "B, S, 8") -> str:
    return f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[{x}] x) => (float[{x}] y) <{inits}> {{
      {body}
    }}
    """


WITH_BOTH = (
    f"float[{H}] gamma = {GAMMA}, float[{H}] beta = {BETA}",
    "y = LayerNormalization<axis = -1, epsilon = 1e-5>(x, gamma, beta)",
)
WITH_GAMMA = (
    f"float[{H}] gamma = {GAMMA}",
    "y = LayerNormalization<axis = -1, epsilon = 1e-5>(x, gamma)",
)
WITH_ONES = (
    f"float[{H}] ones = {lit(np.ones(H))}",
    "n = LayerNormalization<axis = -1, epsilon = 1e-5>(x, ones)\n y = Identity(n)",
)


@pytest.mark.parametrize(
    "kw, want",
    [
        ({}, WITH_BOTH),
        ({"square": "q = Mul(d, d)"}, WITH_BOTH),
        ({"norm": "r = Reciprocal(s)\n  n = Mul(d, r)"}, WITH_BOTH),
        (
            {"norm": "one = Constant <value = float {1}> ()\n  r = Div(one, s)\n  n = Mul(r, d)"},
            WITH_BOTH,
        ),
        ({"tail": "gm = Mul(gamma, n)\n  y = Add(beta, gm)"}, WITH_BOTH),
        ({"tail": "y = Mul(n, gamma)"}, WITH_GAMMA),  # no beta
        ({"tail": "y = Identity(n)"}, WITH_ONES),  # neither: a Scale of ones
        ({"axes": "<axes = [2]>"}, WITH_BOTH),  # positive axis, rank known from x
    ],
)
def test_fuses(kw, want):
    before, result = run(pattern(**kw))
    inits, body = want
    assert_graph_equal(result.model, expected(body, inits))
    check(before, result.model)


def test_two_trailing_axes():
    text = (
        pattern(axes="<axes = [-2, -1]>")
        .replace("float[B, S, 8] x", "float[B, 3, 8] x")
        .replace("float[B, S, 8] y", "float[B, 3, 8] y")
    )
    text = text.replace(f"float[{H}] gamma", "float[1, 8] gamma")
    before, result = run(text)
    gamma, beta = (np.broadcast_to(v, (3, 8)) for v in (GAMMA_VALUES, BETA_VALUES))
    assert_graph_equal(
        result.model,
        expected(
            "y = LayerNormalization<axis = -2, epsilon = 1e-5>(x, gamma, beta)",
            f"float[3, 8] gamma = {lit(gamma)}, float[3, 8] beta = {lit(beta)}",
            x="B, 3, 8",
        ),
    )
    check(before, result.model)


def test_opset18_axes_input():
    text = (
        pattern(opset=18, axes="", inits=", int64[1] ax = {-1}")
        .replace("ReduceMean  (x)", "ReduceMean(x, ax)")
        .replace("ReduceMean  (q)", "ReduceMean(q, ax)")
    )
    before, result = run(text)
    assert_graph_equal(result.model, expected(WITH_BOTH[1], WITH_BOTH[0], opset=18))
    check(before, result.model)


@pytest.mark.parametrize(
    "kw, reasons",
    [
        (
            {"opset": 16},
            ["opset 16 has no LayerNormalization (from 17; optimize(opset=17) upgrades)"],
        ),
        (
            {"inits": ", float minus = {-1}", "tail": "gm = Mul(n, gamma)\n  y = Add(gm, beta)"},
            None,
        ),
        # not the pattern: nothing is refused, there is nothing to rewrite
        ({"axes": "<axes = [1]>"}, []),  # not the trailing axis
        ({"axes": "<axes = [-1], keepdims = 0>"}, []),
        ({"inits": ", float three = {3}", "square": "q = Pow(d, three)"}, []),  # a cube
        (
            {"tail": "gm = Mul(n, gamma)\n  y0 = Add(gm, beta)\n  y = Add(y0, d)"},
            [],
        ),  # d read a third time
    ],
)
def test_must_not_fire(kw, reasons):
    text = pattern(**kw)
    if reasons is None:  # a negative epsilon
        text = text.replace("ve = Add(v, eps)", "ve = Add(v, minus)")
        reasons = ["epsilon is not a non-negative one-element constant"]
    model = model_from_text(text)
    assert refusals(model, "fuse-layernorm") == reasons
    assert_graph_equal(model, text)


def test_without_gamma_the_normalized_shape_must_be_static():
    text = (
        pattern(tail="y = Identity(n)")
        .replace("float[B, S, 8] x", "float[B, S, F] x")
        .replace("float[B, S, 8] y", "float[B, S, F] y")
    )
    model = model_from_text(text)
    assert refusals(model, "fuse-layernorm") == [
        "no gamma and no static normalized dimensions to shape LayerNormalization's Scale"
    ]
    assert_graph_equal(model, text)


def test_variance_as_graph_output_blocks_fusion():
    text = pattern().replace("=> (float[B, S, 8] y)", "=> (float[B, S, 8] y, float[B, S, 1] v)")
    model = model_from_text(text)
    assert refusals(model, "fuse-layernorm") == []
    assert_graph_equal(model, text)


def test_gamma_that_is_not_per_feature_is_left_unfused():
    # gamma of shape (S, 1) scales per position, not per feature: the Mul must stay.
    text = (
        pattern()
        .replace("float[B, S, 8] x", "float[B, 5, 8] x")
        .replace(f"float[{H}] gamma = {GAMMA}", f"float[5, 1] gamma = {lit(np.arange(5))}")
    )
    before, result = run(text)
    assert_graph_equal(
        result.model,
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 5, 8] x) => (float[B, S, 8] y)
        <float[{H}] ones = {lit(np.ones(H))}, float[5, 1] gamma = {lit(np.arange(5))}, float[{H}] beta = {BETA}> {{
          n = LayerNormalization<axis = -1, epsilon = 1e-5>(x, ones)
          gm = Mul(n, gamma)
          y = Add(gm, beta)
        }}
        """,
    )
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
        Block().eval(),
        (torch.randn(2, 5, 16),),
        buf,
        opset_version=export_opset,
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "b", 1: "s"}},
    )
    original = from_proto(onnx.load_from_string(buf.getvalue()))
    assert "LayerNormalization" not in node_ops(original)
    result = optimize(
        from_proto(onnx.load_from_string(buf.getvalue())), opset=target, passes=PASSES
    )
    assert node_ops(result.model).count("LayerNormalization") == 1
    assert not {"ReduceMean", "Sqrt", "Pow"} & set(node_ops(result.model))
    out = verify(original, result.model, dims={"b": 2, "s": 7}, rtol=1e-5, atol=1e-5)
    assert out.passed, out.to_dict()
    # At the exported opset the pass must leave the pattern alone.
    same = optimize(from_proto(onnx.load_from_string(buf.getvalue())), passes=PASSES)
    assert "LayerNormalization" not in node_ops(same.model)
