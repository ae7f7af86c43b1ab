"""dead-code: nodes nobody reads, initializers, functions and opset imports nothing uses go."""

from __future__ import annotations

import numpy as np
from mp_testing import assert_graph_equal, model_from_text

from modelpress.passes import optimize
from modelpress.verify import verify


def test_unused_nodes_initializers_functions_and_opsets_go():
    text = """
    <ir_version: 8, opset_import: ["" : 17, "local" : 1, "unused" : 1]>
    g (float[N, 4] x) => (float[N, 4] y) <float[4] b = {1, 2, 3, 4}, float[4] spare = {5, 6, 7, 8}> {
      dead = Neg(x)
      deader = Exp(dead)
      never = local.f(x)
      y = Add(x, b)
    }
    <domain: "local", opset_import: ["" : 17]>
    f (a) => (o) {
      o = Relu(a)
    }
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["dead-code"])
    # 3 nodes and 1 initializer
    assert result.passes[0].rewrites == 4
    assert_graph_equal(
        result.model,
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) <float[4] b = {1, 2, 3, 4}> {
          y = Add(x, b)
        }
        """,
    )
    assert verify(before, result.model, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_dead_nodes_inside_a_branch_go_and_what_the_branch_reads_stays():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2] x) => (float[2] y) <float[2] k = {1, 2}> {
      h = Relu(x)
      y = If(c) <then_branch = a () => (float[2] o) { unused = Neg(h)  o = Mul(h, k) },
                 else_branch = b () => (float[2] p) { p = Identity(h) }>
    }
    """
    before = model_from_text(text)
    result = optimize(model_from_text(text), passes=["dead-code"])
    assert_graph_equal(result.model, text.replace("unused = Neg(h)  ", ""))
    for flag in (True, False):
        feeds = {"c": np.array(flag), "x": np.array([-1.0, 2.0], np.float32)}
        assert verify(before, result.model, data=feeds, rtol=0.0, atol=0.0).passed
