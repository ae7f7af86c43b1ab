"""cancel-transpose: Transpose pairs compose into one Transpose, or vanish."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes.cancel_transpose import CancelTranspose
from modelpress.verify import verify

PAIR = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[N, 2, 3, 4] x) => (float[N, 4, 3, 2] y) {
  t = Transpose<perm = [0, 2, 3, 1]>(x)
  y = Transpose<perm = [0, 2, 1, 3]>(t)
}
"""


def run(text: str):
    model = model_from_text(text)
    p = CancelTranspose()
    p(model)
    return model_from_text(text), model, p.rewrites


def test_pair_composes_into_one_transpose():
    before, after, rewrites = run(PAIR)
    assert rewrites == 1
    # output axis j takes axis p1[p2[j]]: [0, 3, 2, 1]
    assert_graph_equal(
        after,
        """
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[N, 2, 3, 4] x) => (float[N, 4, 3, 2] y) {
          y = Transpose<perm = [0, 3, 2, 1]>(x)
        }
        """,
    )
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_inverse_pair_disappears():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 2, 3] x) => (float[N, 3, 2] y) {
      t = Transpose<perm = [0, 2, 1]>(x)
      u = Transpose<perm = [0, 2, 1]>(t)
      y = Relu(u)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        """
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[N, 2, 3] x) => (float[N, 3, 2] y) {
          y = Relu(x)
        }
        """,
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_two_default_perms_cancel_without_known_rank():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3] x) => (float y) {
      t = Transpose(x)
      u = Transpose(t)
      y = ReduceSum<keepdims = 0>(u)
    }
    """
    model = model_from_text(text)
    model.graph.inputs[0].shape = None  # rank unknown: reverse∘reverse is still the identity
    CancelTranspose()(model)
    expected = model_from_text(
        text.replace(
            "t = Transpose(x)\n      u = Transpose(t)\n      y = ReduceSum<keepdims = 0>(u)",
            "y = ReduceSum<keepdims = 0>(x)",
        )
    )
    expected.graph.inputs[0].shape = None
    assert_graph_equal(model, expected)


def test_graph_input_to_graph_output_becomes_identity_keeping_names():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3] x) => (float[2, 3] y) {
      t = Transpose<perm = [1, 0]>(x)
      y = Transpose<perm = [1, 0]>(t)
    }
    """
    before, after, _ = run(text)
    assert_graph_equal(
        after,
        text.replace(
            "t = Transpose<perm = [1, 0]>(x)\n      y = Transpose<perm = [1, 0]>(t)",
            "y = Identity(x)",
        ),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_shared_inner_transpose_stays_for_its_other_user():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3, 4] x) => (float[4, 2, 3] y, float[2, 4, 3] z) {
      t = Transpose<perm = [0, 2, 1]>(x)
      y = Transpose<perm = [1, 0, 2]>(t)
      z = Relu(t)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        text.replace("y = Transpose<perm = [1, 0, 2]>(t)", "y = Transpose<perm = [2, 0, 1]>(x)"),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_transpose_after_other_op_is_left_alone():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3] x) => (float[3, 2] y) {
      t = Relu(x)
      y = Transpose<perm = [1, 0]>(t)
    }
    """
    model = model_from_text(text)
    assert refusals(model, "cancel-transpose") == []  # not the pattern: nothing to refuse
    assert_graph_equal(model, text)


def test_pair_across_a_subgraph_boundary_is_refused():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (bool c, float[2, 3] x) => (float[2, 3] y) {
      t = Transpose<perm = [1, 0]>(x)
      y = If(c) <then_branch = a () => (float[2, 3] o) { o = Transpose<perm = [1, 0]>(t) },
                 else_branch = b () => (float[2, 3] p) { p = Identity(x) }>
    }
    """
    model = model_from_text(text)
    assert refusals(model, "cancel-transpose") == [
        "the inner Transpose belongs to an enclosing graph"
    ]
    assert_graph_equal(model, text)


def test_pairs_inside_a_local_function_cancel():
    text = """
    <ir_version: 8, opset_import: ["" : 13, "local" : 1]>
    agraph (float[2, 8] x) => (float[8, 2] y) {
      y = local.f(x)
    }
    <domain: "local", opset_import: ["" : 13]>
    f (a) => (b) {
      r = Relu(a)
      t = Transpose<perm = [1, 0]>(r)
      u = Transpose<perm = [1, 0]>(t)
      b = Transpose<perm = [1, 0]>(u)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        text.replace(
            "t = Transpose<perm = [1, 0]>(r)\n      u = Transpose<perm = [1, 0]>(t)\n      b = Transpose<perm = [1, 0]>(u)",
            "b = Transpose<perm = [1, 0]>(r)",
        ),
    )
    assert [v.name for v in next(iter(after.functions.values())).outputs] == ["b"]
    assert verify(before, after, rtol=0.0, atol=0.0).passed
