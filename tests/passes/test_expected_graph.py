"""The expected-graph check itself: equal graphs pass however they are listed or named; each kind
of difference fails, so a pass test cannot pass by a broken comparison."""

from __future__ import annotations

import pytest
from mp_testing import assert_graph_equal, canonical_order

from modelpress.ir import parse

BASE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, float[4] b) => (float[N, 4] y) <float[4] k = {1, 2, 3, 4}> {
  m = Mul(x, k)
  r = Relu(x)
  s = Add(m, b)
  y = Sub(s, r)
}
"""


def test_listing_order_and_intermediate_names_do_not_matter():
    reordered = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, float[4] b) => (float[N, 4] y) <float[4] w = {1, 2, 3, 4}> {
      relu_out = Relu(x)
      prod = Mul(x, w)
      total = Add(prod, b)
      y = Sub(total, relu_out)
    }
    """
    assert_graph_equal(parse(BASE), reordered)
    assert [n.op_type for n in canonical_order(parse(BASE).graph)] == ["Mul", "Add", "Relu", "Sub"]


def test_constants_compare_within_tolerance():
    assert_graph_equal(parse(BASE), BASE.replace("{1, 2, 3, 4}", "{1, 2, 3, 4.0000001}"))


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("y = Sub(s, r)", "y = Add(s, r)", "ops"),
        ("y = Sub(s, r)", "y = Sub(r, s)", "ops"),  # swapped operands change the order too
        ("m = Mul(x, k)", "m = Mul(k, x)", "input 0"),
        ("s = Add(m, b)", "s = Add(m, k)", "input 1"),
        ("{1, 2, 3, 4}", "{1, 2, 3, 5}", "values"),
        ("r = Relu(x)", "r = LeakyRelu<alpha = 0.1>(x)", "ops"),
        ("float[4] b)", "float[4] bias)", "graph input"),
        ("float[N, 4] y)", "float[M, 4] y)", "graph output"),
        ('"" : 17', '"" : 18', "opset imports"),
    ],
)
def test_each_difference_fails(old, new, message):
    assert old in BASE
    with pytest.raises(AssertionError, match=message):
        assert_graph_equal(parse(BASE), BASE.replace(old, new))


def test_attributes_and_subgraphs_are_compared():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2] x) => (float[2] y) {
      t = LeakyRelu<alpha = 0.5>(x)
      y = If(c) <then_branch = a () => (float[2] o) { o = Neg(t) },
                 else_branch = b () => (float[2] p) { p = Abs(t) }>
    }
    """
    assert_graph_equal(parse(text), text)
    with pytest.raises(AssertionError, match="alpha"):
        assert_graph_equal(parse(text), text.replace("0.5", "0.25"))
    with pytest.raises(AssertionError, match="ops"):
        assert_graph_equal(parse(text), text.replace("p = Abs(t)", "p = Neg(t)"))
