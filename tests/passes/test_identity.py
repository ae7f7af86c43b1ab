"""identity: Identity(x) → x, except where a graph output could not take x's place."""

from __future__ import annotations

import numpy as np
from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes import optimize
from modelpress.verify import verify


def test_identities_go_and_the_output_keeps_its_name():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
      a = Identity(x)
      r = Relu(a)
      y = Identity(r)
    }
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["identity"])
    assert result.passes[0].rewrites == 2
    assert_graph_equal(
        result.model,
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) {
          y = Relu(x)
        }
        """,
    )
    assert verify(before, result.model, dims={"N": 2}, rtol=0.0, atol=0.0).passed


OUTSIDE = "the result is a graph output, and what would replace it is not computed in this graph"


def test_an_input_passed_to_an_output_and_a_branch_returning_an_outer_value_keep_theirs():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2] x) => (float[2] y, float[2] z) {
      z = Identity(x)
      h = Relu(x)
      y = If(c) <then_branch = a () => (float[2] o) { o = Identity(h) },
                 else_branch = b () => (float[2] p) { p = Neg(h) }>
    }
    """
    model = model_from_text(text)
    assert refusals(model, "identity") == [OUTSIDE, OUTSIDE]
    assert_graph_equal(model, text)
    before = model_from_text(text)
    for flag in (True, False):
        feeds = {"c": np.array(flag), "x": np.array([-1.0, 2.0], np.float32)}
        assert verify(before, model, data=feeds, rtol=0.0, atol=0.0).passed


def test_two_outputs_of_one_value_keep_one_identity():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y, float[2] z) {
      y = Relu(x)
      z = Identity(y)
    }
    """
    model = model_from_text(text)
    assert refusals(model, "identity") == [
        "the result is a graph output, and what would replace it has a fixed name"
    ]
    assert_graph_equal(model, text)
