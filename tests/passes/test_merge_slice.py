"""merge-slice: consecutive Slices become one."""

from __future__ import annotations

import numpy as np
import onnx
from mp_testing import assert_graph_equal, model_from_text, node_ops, refusals

from modelpress.ir import to_proto
from modelpress.ir.stats import iter_graphs, iter_nodes
from modelpress.passes.merge_slice import MergeSlice
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = MergeSlice()
    p(model)
    return model_from_text(text), model, p.rewrites


def merged(text: str, old: str, new: str, inits: str = "") -> str:
    """``text`` with the body ``old`` replaced by ``new`` and the initializers ``inits`` added (the
    Slices' old parameters stay: removing them is dead-code elimination's business)."""
    assert old in text
    text = text.replace(old, new)
    if inits:
        head, sep, rest = text.partition("> {")
        text = f"{head}, {inits}{sep}{rest}"
    return text


def test_disjoint_axes_merge_with_dynamic_dims():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[N, 8, M] x) => (float[N, 2, K] y)
      <int64[1] s1 = {1}, int64[1] e1 = {5}, int64[1] a1 = {1}, int64[1] t1 = {2},
       int64[1] s2 = {-1}, int64[1] e2 = {-1000}, int64[1] a2 = {2}, int64[1] t2 = {-1}> {
      a = Slice(x, s1, e1, a1, t1)
      y = Slice(a, s2, e2, a2, t2)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        merged(
            text,
            "a = Slice(x, s1, e1, a1, t1)\n      y = Slice(a, s2, e2, a2, t2)",
            "y = Slice(x, s, e, a, t)",
            "int64[2] s = {1, -1}, int64[2] e = {5, -1000}, int64[2] a = {1, 2}, int64[2] t = {2, -1}",
        ),
    )
    assert verify(before, after, dims={"N": 2, "M": 5}, rtol=0.0, atol=0.0).passed


def test_same_axis_step_one_composes_with_unknown_size():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, N] x) => (float[2, K] y)
      <int64[1] s1 = {2}, int64[1] e1 = {9}, int64[1] s2 = {1}, int64[1] e2 = {100}, int64[1] a = {1}> {
      b = Slice(x, s1, e1, a)
      y = Slice(b, s2, e2, a)
    }
    """
    before, after, _ = run(text)
    assert_graph_equal(
        after,
        merged(
            text,
            "b = Slice(x, s1, e1, a)\n      y = Slice(b, s2, e2, a)",
            "y = Slice(x, s, e, ax, t)",
            "int64[1] s = {3}, int64[1] e = {9}, int64[1] ax = {1}, int64[1] t = {1}",
        ),
    )
    for n in (1, 3, 5, 12):  # shorter and longer than the slices
        assert verify(before, after, dims={"N": n}, rtol=0.0, atol=0.0).passed, n


def test_same_axis_negative_bounds_with_static_size_opset9():
    text = """
    <ir_version: 4, opset_import: ["" : 9]>
    agraph (float[3, 10] x) => (float[3, 4] y) {
      a = Slice<starts = [1], ends = [-1], axes = [-1]>(x)
      y = Slice<starts = [-6], ends = [-2], axes = [1]>(a)
    }
    """
    before, after, _ = run(text)
    assert_graph_equal(
        after,
        merged(
            text,
            "a = Slice<starts = [1], ends = [-1], axes = [-1]>(x)\n      y = Slice<starts = [-6], ends = [-2], axes = [1]>(a)",
            "y = Slice<starts = [3], ends = [7], axes = [1]>(x)",
        ),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_must_not_fire():
    cases = {
        "both slice axis 1, not both with step 1": """
        agraph (float[2, 8] x) => (float[2, 2] y) <int64[1] s = {0}, int64[1] e = {8}, int64[1] a = {1}, int64[1] t = {2}> {
          b = Slice(x, s, e, a, t)
          y = Slice(b, s, e, a, t)
        }""",
        "axis 1 has negative bounds and no known size to normalize them": """
        agraph (float[2, N] x) => (float[2, K] y) <int64[1] s = {1}, int64[1] e = {-1}, int64[1] a = {1}> {
          b = Slice(x, s, e, a)
          y = Slice(b, s, e, a)
        }""",
        "a Slice's parameters are not all constant": """
        agraph (float[2, 8] x, int64[1] e) => (float[2, K] y) <int64[1] s = {1}, int64[1] a = {1}> {
          b = Slice(x, s, e, a)
          y = Slice(b, s, e, a)
        }""",
    }
    for reason, body in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 13]>' + body
        model = model_from_text(text)
        assert refusals(model, "merge-slice") == [reason]
        assert_graph_equal(model, text)


def test_slices_merge_in_main_graph_and_subgraph_with_unique_names():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (bool c, float[4, 8] x) => (float[3, 5] y, float[3, 5] z)
      <int64[1] s = {1}, int64[1] e = {7}, int64[1] a0 = {0}, int64[1] a1 = {1}> {
      p = Slice(x, s, e, a1)
      q = Slice(p, s, e, a0)
      z = Slice(q, s, e, a1)
      y = If(c) <then_branch = g1 () => (float[3, 5] t) {
                   u = Slice(x, s, e, a0)
                   v = Slice(u, s, e, a1)
                   t = Slice(v, s, e, a1)
                 },
                 else_branch = g2 () => (float[3, 5] f) { f = Identity(z) }>
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 4
    assert node_ops(after) == ["Slice", "If"]
    then_branch = after.graph.node(1).attributes["then_branch"].value
    assert [n.op_type for n in then_branch] == ["Slice"]
    onnx.checker.check_model(to_proto(after), full_check=True)
    # ONNX wants names unique across a graph and its subgraphs (the checker does not look).
    names = [v for g in iter_graphs(after.graph) for v in g.initializers]
    names += [o.name for n in iter_nodes(after.graph) for o in n.outputs]
    assert len(names) == len(set(names))
    for flag in (True, False):
        feeds = {"c": np.array(flag), "x": np.arange(32, dtype=np.float32).reshape(4, 8)}
        assert verify(before, after, data=feeds, rtol=0.0, atol=0.0).passed
