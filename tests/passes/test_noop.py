"""noop: nodes that provably return their input disappear; the ones that might not stay."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes import optimize
from modelpress.verify import verify

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def run(text: str):
    before = model_from_text(text)
    after = model_from_text(text)
    result = optimize(after, passes=["noop"])
    return before, result


def test_every_noop_kind_is_removed_and_results_are_exact():
    before, result = run(f"""
    {HEADER}
    g (float[N, 3, 4] x) => (float[N, 3, 4] y)
    <int64[3] same = {{0, 3, -1}}, int64[3] ones = {{1, 1, 4}}, int64[6] z6 = {{0, 0, 0, 0, 0, 0}},
     int64[1] s0 = {{0}}, int64[1] e = {{9223372036854775807}}, int64[1] ax = {{2}},
     float one = {{1.0}}, float[4] zeros = {{0, 0, 0, 0}}, float[3, 1] ones31 = {{1, 1, 1}}> {{
      a = Dropout(x)
      b = Cast<to = 1>(a)
      c = Reshape(b, same)
      d = Expand(c, ones)
      t = Transpose<perm = [0, 1, 2]>(d)
      p = Pad(t, z6)
      s = Slice(p, s0, e, ax)
      k = Concat<axis = 1>(s)
      m = Mul(one, k)
      ad = Add(m, zeros)
      sb = Sub(ad, zeros)
      dv = Div(sb, ones31)
      y = Relu(dv)
    }}
    """)
    after = optimize(result.model, passes=["dead-code"]).model  # the constants nothing reads now
    assert_graph_equal(
        after,
        f"""
        {HEADER}
        g (float[N, 3, 4] x) => (float[N, 3, 4] y) {{
          y = Relu(x)
        }}
        """,
    )
    assert result.passes[0].rewrites == 12
    for n in (1, 5):
        assert verify(before, after, dims={"N": n}, rtol=0.0, atol=0.0).passed


NOT_ONE = "no operand is a constant 1 that keeps the other's shape"
NOT_ZERO = "no operand is a constant 0 that keeps the other's shape"
SHAPE_UNKNOWN = "the input's shape or the target shape is not known"


@pytest.mark.parametrize(
    "body, out, reason",
    [
        (
            "y = Mul(x, ones23)",
            "float[2, 2, 3]",
            NOT_ONE,
        ),  # the constant broadcasts x to a larger shape
        ("y = Add(x, half)", "float[N, 2, 3]", NOT_ZERO),  # adding 0.5 is no no-op
        ("y = Sub(zero, x)", "float[N, 2, 3]", NOT_ZERO),  # 0 - x is a negation
        ("y = Div(ones23, x)", "float[2, 2, 3]", NOT_ONE),  # 1 / x is a reciprocal
        ("y = Reshape(x, flat)", "float[N, 6]", "the target's rank differs from the input's"),
        (
            "y = Expand(x, big)",
            "float[1, N, 2, 3]",
            "the target has a higher rank than the input",
        ),
        (
            "y = Transpose<perm = [1, 0, 2]>(x)",
            "float[2, N, 3]",
            "the permutation is not the identity",
        ),
        (
            "y = Slice(x, s1, e, ax0)",
            "float[M, 2, 3]",
            "axis 0: [1:9223372036854775807] is not known to keep the whole axis",
        ),
        (
            "y = Slice(x, m1, bigneg, ax1, m1)",
            "float[N, 2, 3]",
            "axis 1: a step other than 1, or no such axis",
        ),  # reverses
        # N may be 1 at run time, and Squeeze would drop it
        ("y = Squeeze(x)", "float[N, 2, 3]", "the input may have a size-1 dimension"),
        ("y = Cast<to = 11>(x)", "double[N, 2, 3]", "it changes the dtype"),
    ],
)
def test_what_is_not_a_noop_stays(body, out, reason):
    text = f"""
    {HEADER}
    g (float[N, 2, 3] x) => ({out} y)
    <float[2, 2, 3] ones23 = {{1,1,1,1,1,1,1,1,1,1,1,1}}, float half = {{0.5}}, float zero = {{0.0}},
     int64[2] flat = {{0, -1}}, int64[4] big = {{1, 1, 2, 3}}, int64[1] s1 = {{1}},
     int64[1] e = {{9223372036854775807}}, int64[1] ax0 = {{0}}, int64[1] ax1 = {{1}},
     int64[1] m1 = {{-1}}, int64[1] bigneg = {{-9223372036854775807}}> {{
      {body}
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "noop") == [reason]
    assert_graph_equal(model, text)


def test_dropout_in_training_mode_or_with_a_used_mask_stays():
    text = f"""
    {HEADER}
    g (float[2, 3] x, bool train) => (float[2, 3] y, float[2, 3] z, bool[2, 3] mask)
    <float half = {{0.5}}> {{
      y = Dropout(x, half, train)
      z, mask = Dropout(x)
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "noop") == [
        "training_mode is not a constant false",
        "its mask output is used",
    ]
    assert_graph_equal(model, text)


def test_output_names_stay_and_an_input_cannot_become_an_output():
    text = f"""
    {HEADER}
    g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {{
      r = Relu(x)
      y = Cast<to = 1>(r)
      z = Dropout(x)
    }}
    """
    before, result = run(text)
    after = result.model
    # y's Cast goes (Relu now writes y); z = Dropout(x) must stay: x is an input and z an output.
    assert_graph_equal(after, text.replace("r = Relu(x)\n      y = Cast<to = 1>(r)", "y = Relu(x)"))
    assert after.graph.node(0).outputs[0].name == "y"
    assert refusals(model_from_text(text), "noop") == [
        "the result is a graph output, and what would replace it is not computed in this graph"
    ]
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_if_branches_are_cleaned_too():
    text = f"""
    {HEADER}
    g (bool c, float[N, 2] x) => (float[N, 2] y) <float one = {{1.0}}> {{
      y = If(c) <then_branch = g1 () => (float[N, 2] a) {{ t = Mul(x, one)  a = Relu(t) }},
                 else_branch = g2 () => (float[N, 2] b) {{ u = Dropout(x)  b = Neg(u) }}>
    }}
    """
    before, result = run(text)
    assert result.rewrites == 2
    assert_graph_equal(
        result.model,
        text.replace("t = Mul(x, one)  a = Relu(t)", "a = Relu(x)").replace(
            "u = Dropout(x)  b = Neg(u)", "b = Neg(x)"
        ),
    )
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        assert verify(before, result.model, data=feeds, rtol=0.0, atol=0.0).passed


def test_old_opsets_keep_their_arguments_in_attributes():
    text = """
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[N, 3] x) => (float[N, 3] y) {
      a = Dropout<ratio = 0.3>(x)
      p = Pad<pads = [0, 0, 0, 0]>(a)
      s = Slice<starts = [0], ends = [2147483647], axes = [1]>(p)
      u = Unsqueeze<axes = [0]>(s)
      q = Squeeze<axes = [0]>(u)
      y = Relu(q)
    }
    """
    before, result = run(text)
    # Unsqueeze then Squeeze is a pair, not a no-op each: they stay for cancel-squeeze.
    assert_graph_equal(
        result.model,
        text.replace(
            "a = Dropout<ratio = 0.3>(x)\n      p = Pad<pads = [0, 0, 0, 0]>(a)\n      s = Slice<starts = [0], ends = [2147483647], axes = [1]>(p)\n      u = Unsqueeze<axes = [0]>(s)",
            "u = Unsqueeze<axes = [0]>(x)",
        ),
    )
    assert refusals(model_from_text(text), "noop") == [
        "it has axes",
        "it has axes, or the input's shape is not known",
    ]
    assert verify(before, result.model, dims={"N": 4}, rtol=0.0, atol=0.0).passed


def test_reshape_and_expand_to_the_inputs_own_dynamic_shape_go():
    text = f"""
    {HEADER}
    g (float[N, M] x) => (float[N, M] y) {{
      s = Shape(x)
      r = Reshape(x, s)
      e = Expand(r, s)
      y = Relu(e)
    }}
    """
    before, result = run(text)
    # the Shape stays for dead-code elimination
    assert_graph_equal(
        result.model,
        text.replace("r = Reshape(x, s)\n      e = Expand(r, s)\n      y = Relu(e)", "y = Relu(x)"),
    )
    assert verify(before, result.model, dims={"N": 3, "M": 5}, rtol=0.0, atol=0.0).passed


def test_a_branch_returning_an_outer_value_keeps_the_node_in_between():
    # ONNX Runtime rejects a subgraph that returns an outer-scope value directly.
    text = f"""
    {HEADER}
    g (bool c, float[N, 2] x) => (float[N, 2] y) <float one = {{1.0}}> {{
      h = Relu(x)
      y = If(c) <then_branch = g1 () => (float[N, 2] a) {{ a = Dropout(h) }},
                 else_branch = g2 () => (float[N, 2] b) {{ b = Mul(h, one) }}>
    }}
    """
    before, result = run(text)
    assert result.rewrites == 0
    assert_graph_equal(result.model, text)
    assert (
        refusals(model_from_text(text), "noop")
        == ["the result is a graph output, and what would replace it is not computed in this graph"]
        * 2
    )
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        assert verify(before, result.model, data=feeds, rtol=0.0, atol=0.0).passed
