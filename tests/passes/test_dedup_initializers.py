"""dedup-initializers: constants with equal dtype, shape and bytes become one."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text

from modelpress.passes import optimize
from modelpress.verify import verify


def test_equal_constants_are_stored_once():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3] x) => (float[N, 3] y)
    <float[3] a = {1, 2, 3}, float[3] b = {1, 2, 3}, float[3] c = {1, 2, 4}, double[3] d = {1, 2, 3}> {
      p = Mul(x, a)
      q = Add(p, b)
      r = Sub(q, c)
      dr = Cast<to = 11>(r)
      e = Mul(dr, d)
      y = Cast<to = 1>(e)
    }
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["dedup-initializers"])
    assert result.passes[0].rewrites == 1  # b is a; c differs in a byte, d in dtype
    assert_graph_equal(
        result.model, text.replace("float[3] b = {1, 2, 3}, ", "").replace("Add(p, b)", "Add(p, a)")
    )
    assert verify(before, result.model, dims={"N": 2}, rtol=0.0, atol=0.0).passed
