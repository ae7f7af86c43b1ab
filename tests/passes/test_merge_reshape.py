"""merge-reshape: shape-only chains collapse into their last Reshape."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes.merge_reshape import MergeReshape
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = MergeReshape()
    p(model)
    return model_from_text(text), model, p.rewrites


def test_reshape_chain_collapses_with_dynamic_batch():
    text = """
    <ir_version: 8, opset_import: ["" : 14]>
    agraph (float[N, 2, 3, 4] x) => (float[N, 24] y)
      <int64[3] s1 = {-1, 6, 4}, int64[2] s2 = {-1, 24}, int64[1] ax = {1}> {
      a = Reshape(x, s1)
      b = Unsqueeze(a, ax)
      c = Flatten<axis = 1>(b)
      y = Reshape(c, s2)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    # the merged-away nodes' constants stay for dead-code elimination
    assert_graph_equal(
        after,
        text.replace(
            "a = Reshape(x, s1)\n      b = Unsqueeze(a, ax)\n      c = Flatten<axis = 1>(b)\n      y = Reshape(c, s2)",
            "y = Reshape(x, s2)",
        ),
    )
    assert after.graph.node(0).inputs[1].name == "s2"
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_each_reshape_of_a_chain_reads_the_source():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, 12] x) => (float[24] y) <int64[2] s1 = {4, 6}, int64[3] s2 = {2, 3, 4}, int64[1] s3 = {-1}> {
      a = Reshape(x, s1)
      b = Reshape(a, s2)
      y = Reshape(b, s3)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 2
    assert_graph_equal(
        after,
        text.replace(
            "a = Reshape(x, s1)\n      b = Reshape(a, s2)\n      y = Reshape(b, s3)",
            "y = Reshape(x, s3)",
        ),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_allowzero_zero_is_a_literal_and_merges():
    text = """
    <ir_version: 8, opset_import: ["" : 14]>
    agraph (float[0, 3] x) => (float[3, 0] y) <int64[1] s1 = {-1}, int64[2] s2 = {3, 0}> {
      a = Flatten<axis = 0>(x)
      y = Reshape<allowzero = 1>(a, s2)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        text.replace(
            "a = Flatten<axis = 0>(x)\n      y = Reshape<allowzero = 1>(a, s2)",
            "y = Reshape<allowzero = 1>(x, s2)",
        ),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_must_not_fire():
    cases = {
        "a 0 in the target copies a dimension of the intermediate tensor, which is bypassed": """
        agraph (float[2, 3, 4] x) => (float[6, 4] y) <int64[2] s1 = {6, 4}, int64[2] s2 = {0, -1}> {
          a = Reshape(x, s1)
          y = Reshape(a, s2)
        }""",
        "the target shape is neither a constant nor Shape(t) (from opset 14)": """
        agraph (float[2, 3, 4] x, int64[2] s2) => (float[A, B] y) <int64[2] s1 = {6, 4}> {
          a = Reshape(x, s1)
          y = Reshape(a, s2)
        }""",
        "": """  # Transpose changes the element order: not the pattern, nothing to refuse
        agraph (float[2, 3] x) => (float[6] y) <int64[1] s2 = {6}> {
          a = Transpose<perm = [1, 0]>(x)
          y = Reshape(a, s2)
        }""",
    }
    for reason, body in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 14]>' + body
        model = model_from_text(text)
        assert refusals(model, "merge-reshape") == ([reason] if reason else [])
        assert_graph_equal(model, text)


def test_shared_intermediate_stays_for_its_other_user():
    text = """
    <ir_version: 8, opset_import: ["" : 14]>
    agraph (float[2, 6] x) => (float[12] y, float[3, 4] z) <int64[2] s1 = {3, 4}, int64[1] s2 = {12}> {
      z = Reshape(x, s1)
      y = Reshape(z, s2)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(after, text.replace("y = Reshape(z, s2)", "y = Reshape(x, s2)"))
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_reshape_like_a_tensor_merges_with_allowzero_from_opset_14():
    text = """
    <ir_version: 8, opset_import: ["" : OPSET]>
    g (float[B, 4, 6] x, float[B, 24] t) => (float[B, 24] y) {
      flat = Constant<value = int64[1] {-1}>()
      r1 = Reshape(x, flat)
      s = Shape(t)
      y = Reshape(r1, s)
    }
    """
    before, after, count = run(text.replace("OPSET", "17"))
    assert count == 1
    assert_graph_equal(
        after,
        text.replace("OPSET", "17").replace(
            "r1 = Reshape(x, flat)\n      s = Shape(t)\n      y = Reshape(r1, s)",
            "s = Shape(t)\n      y = Reshape<allowzero = 1>(x, s)",
        ),
    )
    assert verify(before, after, dims={"B": 3}, rtol=0.0, atol=0.0).passed
    # opset 13 has no allowzero: the pair stays
    model = model_from_text(text.replace("OPSET", "13"))
    assert refusals(model, "merge-reshape") == [
        "the target shape is neither a constant nor Shape(t) (from opset 14)"
    ]
    assert_graph_equal(model, text.replace("OPSET", "13"))
