"""cancel-transpose: Transpose pairs compose into one Transpose, or vanish."""

from __future__ import annotations

from mp_testing import model_from_text, node_ops

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
    assert node_ops(after) == ["Transpose"]
    # output axis j takes axis p1[p2[j]]: [0, 3, 2, 1]
    assert list(after.graph.node(0).attributes["perm"].as_ints()) == [0, 3, 2, 1]
    assert after.graph.outputs[0].name == "y"
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
    assert node_ops(after) == ["Relu"]
    assert after.graph.node(0).inputs[0].name == "x"
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
    assert node_ops(model) == ["ReduceSum"]


def test_graph_input_to_graph_output_becomes_identity_keeping_names():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3] x) => (float[2, 3] y) {
      t = Transpose<perm = [1, 0]>(x)
      y = Transpose<perm = [1, 0]>(t)
    }
    """
    before, after, _ = run(text)
    assert node_ops(after) == ["Identity"]
    assert [v.name for v in after.graph.outputs] == ["y"]
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
    assert sorted(node_ops(after)) == ["Relu", "Transpose", "Transpose"]
    outer = next(n for n in after.graph if n.outputs[0].name == "y")
    assert outer.inputs[0].name == "x"
    assert list(outer.attributes["perm"].as_ints()) == [2, 0, 1]
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_transpose_after_other_op_is_left_alone():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2, 3] x) => (float[3, 2] y) {
      t = Relu(x)
      y = Transpose<perm = [1, 0]>(t)
    }
    """
    _, after, rewrites = run(text)
    assert rewrites == 0
    assert node_ops(after) == ["Relu", "Transpose"]


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
    function = next(iter(after.functions.values()))
    assert [n.op_type for n in function] == ["Relu", "Transpose"]
    assert [v.name for v in function.outputs] == ["b"]
    assert verify(before, after, rtol=0.0, atol=0.0).passed
