"""noop: nodes that provably return their input disappear; the ones that might not stay."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops, structure

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
    expected = model_from_text(f"""
    {HEADER}
    g (float[N, 3, 4] x) => (float[N, 3, 4] y) {{
      y = Relu(x)
    }}
    """)
    after = result.model
    assert structure(after) == structure(expected)
    assert result.passes[0].rewrites == 12
    assert after.graph.outputs[0].name == "y"
    assert [str(d) for d in after.graph.outputs[0].shape] == ["N", "3", "4"]
    for n in (1, 5):
        assert verify(before, after, dims={"N": n}, rtol=0.0, atol=0.0).passed


@pytest.mark.parametrize(
    "body, out, why",
    [
        ("y = Mul(x, ones23)", "float[2, 2, 3]", "the constant broadcasts x to a larger shape"),
        ("y = Add(x, half)", "float[N, 2, 3]", "adding 0.5 is no no-op"),
        ("y = Sub(zero, x)", "float[N, 2, 3]", "0 - x is a negation"),
        ("y = Div(ones23, x)", "float[2, 2, 3]", "1 / x is a reciprocal"),
        ("y = Reshape(x, flat)", "float[N, 6]", "the shape changes"),
        ("y = Expand(x, big)", "float[1, N, 2, 3]", "Expand to a larger rank"),
        ("y = Transpose<perm = [1, 0, 2]>(x)", "float[2, N, 3]", "a real permutation"),
        ("y = Slice(x, s1, e, ax0)", "float[M, 2, 3]", "drops the first row"),
        ("y = Slice(x, m1, bigneg, ax1, m1)", "float[N, 2, 3]", "reverses an axis"),
        ("y = Squeeze(x)", "float[N, 2, 3]", "N may be 1 at run time, and Squeeze would drop it"),
        ("y = Cast<to = 11>(x)", "double[N, 2, 3]", "float to double"),
    ],
)
def test_what_is_not_a_noop_stays(body, out, why):
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
    before, result = run(text)
    assert result.rewrites == 0, why
    assert node_ops(result.model) == node_ops(before)


def test_dropout_in_training_mode_or_with_a_used_mask_stays():
    before, result = run(f"""
    {HEADER}
    g (float[2, 3] x, bool train) => (float[2, 3] y, float[2, 3] z, bool[2, 3] mask)
    <float half = {{0.5}}> {{
      y = Dropout(x, half, train)
      z, mask = Dropout(x)
    }}
    """)
    assert result.rewrites == 0
    assert node_ops(result.model) == ["Dropout", "Dropout"]


def test_output_names_stay_and_an_input_cannot_become_an_output():
    before, result = run(f"""
    {HEADER}
    g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {{
      r = Relu(x)
      y = Cast<to = 1>(r)
      z = Dropout(x)
    }}
    """)
    after = result.model
    # y's Cast goes (Relu now writes y); z = Dropout(x) must stay: x is an input and z an output.
    assert node_ops(after) == ["Relu", "Dropout"]
    assert [v.name for v in after.graph.outputs] == ["y", "z"]
    assert after.graph.node(0).outputs[0].name == "y"
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
    branches = [a.value for a in result.model.graph.node(0).attributes.values()]
    assert sorted(n.op_type for g in branches for n in g) == ["Neg", "Relu"]
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        assert verify(before, result.model, inputs=feeds, rtol=0.0, atol=0.0).passed


def test_old_opsets_keep_their_arguments_in_attributes():
    before, result = run("""
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[N, 3] x) => (float[N, 3] y) {
      a = Dropout<ratio = 0.3>(x)
      p = Pad<pads = [0, 0, 0, 0]>(a)
      s = Slice<starts = [0], ends = [2147483647], axes = [1]>(p)
      u = Unsqueeze<axes = [0]>(s)
      q = Squeeze<axes = [0]>(u)
      y = Relu(q)
    }
    """)
    # Unsqueeze then Squeeze is a pair, not a no-op each: they stay for cancel-squeeze.
    assert node_ops(result.model) == ["Unsqueeze", "Squeeze", "Relu"]
    assert verify(before, result.model, dims={"N": 4}, rtol=0.0, atol=0.0).passed


def test_reshape_and_expand_to_the_inputs_own_dynamic_shape_go():
    before, result = run(f"""
    {HEADER}
    g (float[N, M] x) => (float[N, M] y) {{
      s = Shape(x)
      r = Reshape(x, s)
      e = Expand(r, s)
      y = Relu(e)
    }}
    """)
    assert node_ops(result.model) == ["Shape", "Relu"]  # dead-code removes the Shape
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
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        assert verify(before, result.model, inputs=feeds, rtol=0.0, atol=0.0).passed
