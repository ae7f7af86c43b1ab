"""cse: two nodes with the same op, attributes and inputs become one; random ops stay apart."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text

from modelpress.passes import optimize
from modelpress.verify import verify


def test_repeated_subexpressions_are_computed_once():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) <float[4] b = {1, 2, 3, 4}> {
      a1 = Add(x, b)
      a2 = Add(x, b)
      r1 = Relu(a1)
      r2 = Relu(a2)
      y = Mul(r1, r2)
    }
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["cse"])
    assert result.passes[0].rewrites == 2
    assert_graph_equal(
        result.model,
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) <float[4] b = {1, 2, 3, 4}> {
          a = Add(x, b)
          r = Relu(a)
          y = Mul(r, r)
        }
        """,
    )
    assert verify(before, result.model, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_different_attributes_and_random_ops_are_not_merged():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 4] x) => (float[2, 4] y, float[2, 4] z) {
      s1 = Softmax<axis = 0>(x)
      s2 = Softmax<axis = 1>(x)
      n1 = RandomNormalLike(x)
      n2 = RandomNormalLike(x)
      a = Add(s1, n1)
      y = Add(a, n2)
      z = Mul(s2, x)
    }
    """
    result = optimize(model_from_text(text), passes=["cse"])
    assert result.passes[0].rewrites == 0
    assert_graph_equal(result.model, text)
