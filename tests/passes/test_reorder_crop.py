"""reorder-crop: Slice / Gather move ahead of element-wise ops, cropping constants with them."""

from __future__ import annotations

import numpy as np
from mp_testing import model_from_text, node_ops

from modelpress.passes.reorder_crop import ReorderCrop
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = ReorderCrop()
    p(model)
    return model_from_text(text), model, p.rewrites


def by_output(model, name):
    return next(n for n in model.graph if any(o.name == name for o in n.outputs))


def test_slice_moves_ahead_of_unary_chain_with_dynamic_batch():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 8] x) => (float[N, 3] y) <int64[1] s = {1}, int64[1] e = {4}, int64[1] a = {1}> {
      r = Relu(x)
      g = Sigmoid(r)
      y = Slice(g, s, e, a)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 2
    assert node_ops(after) == ["Slice", "Relu", "Sigmoid"]
    assert after.graph.node(0).inputs[0].name == "x"
    assert [v.name for v in after.graph.outputs] == ["y"]
    assert verify(before, after, dims={"N": 5}, rtol=1e-6, atol=0.0).passed


def test_bias_is_sliced_along_with_the_data():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 8] x) => (float[N, 4] y)
      <float[8] b = {0, 1, 2, 3, 4, 5, 6, 7}, int64[1] s = {2}, int64[1] e = {6}, int64[1] a = {-1}> {
      t = Add(x, b)
      y = Slice(t, s, e, a)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert node_ops(after) == ["Slice", "Add"]
    add = after.graph.node(1)
    np.testing.assert_array_equal(add.inputs[1].const_value.numpy(), [2, 3, 4, 5])
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_gather_scalar_index_drops_the_axis_from_the_constant():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 4, 3] x) => (float[N, 3] y)
      <float[4, 1] c = {10, 20, 30, 40}, int64 i = {-2}> {
      t = Mul(c, x)
      y = Gather<axis = 1>(t, i)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert node_ops(after) == ["Gather", "Mul"]
    mul = after.graph.node(1)
    np.testing.assert_array_equal(mul.inputs[0].const_value.numpy(), [30])
    assert mul.inputs[1] is after.graph.node(0).outputs[0]  # operand order kept (c first)
    assert verify(before, after, dims={"N": 2}, rtol=0.0, atol=0.0).passed


def test_several_small_crops_duplicate_the_op():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, 8] x) => (float[2, 2] y, float[2, 2] z)
      <int64[1] s0 = {0}, int64[1] e0 = {2}, int64[1] s1 = {6}, int64[1] e1 = {8}, int64[1] a = {1}> {
      t = Exp(x)
      y = Slice(t, s0, e0, a)
      z = Slice(t, s1, e1, a)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 2
    assert sorted(node_ops(after)) == ["Exp", "Exp", "Slice", "Slice"]
    assert [v.name for v in after.graph.outputs] == ["y", "z"]
    assert verify(before, after, rtol=1e-6, atol=0.0).passed


def test_old_opset_attribute_slice_and_clip_scalars():
    text = """
    <ir_version: 4, opset_import: ["" : 9]>
    agraph (float[3, 6] x) => (float[3, 2] y) {
      t = Clip<min = -0.5, max = 0.5>(x)
      y = Slice<starts = [1], ends = [5], axes = [1]>(t)
    }
    """
    before, after, _ = run(text)
    assert node_ops(after) == ["Slice", "Clip"]
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_clip_with_scalar_inputs_and_step():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[N, 6] x) => (float[N, 3] y)
      <float lo = {-0.5}, float hi = {0.5}, int64[1] s = {5}, int64[1] e = {-100}, int64[1] a = {1}, int64[1] st = {-2}> {
      t = Clip(x, lo, hi)
      y = Slice(t, s, e, a, st)
    }
    """
    before, after, _ = run(text)
    assert node_ops(after) == ["Slice", "Clip"]
    assert verify(before, after, dims={"N": 4}, rtol=0.0, atol=0.0).passed


def test_must_not_fire():
    cases = {
        # the element-wise result has another, non-crop user
        "other use": """
        agraph (float[2, 8] x) => (float[2, 4] y, float[2, 8] z) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Relu(x)
          y = Slice(t, s, e, a)
          z = Neg(t)
        }""",
        # x may be 1 along the cropped axis and broadcast against the constant
        "broadcast": """
        agraph (float[2, M] x) => (float[2, 4] y) <float[8] b = {0, 1, 2, 3, 4, 5, 6, 7}, int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Add(x, b)
          y = Slice(t, s, e, a)
        }""",
        # slice bounds computed at run time
        "dynamic bounds": """
        agraph (float[2, 8] x, int64[1] e) => (float[2, M] y) <int64[1] s = {0}, int64[1] a = {1}> {
          t = Relu(x)
          y = Slice(t, s, e, a)
        }""",
        # not element-wise
        "softmax": """
        agraph (float[2, 8] x) => (float[2, 4] y) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Softmax<axis = 1>(x)
          y = Slice(t, s, e, a)
        }""",
        # overlapping crops keep more than the op computes: duplicating it would add work
        "overlap": """
        agraph (float[2, 8] x) => (float[2, 6] y, float[2, 6] z) <int64[1] s0 = {0}, int64[1] e0 = {6}, int64[1] s1 = {2}, int64[1] e1 = {8}, int64[1] a = {1}> {
          t = Exp(x)
          y = Slice(t, s0, e0, a)
          z = Slice(t, s1, e1, a)
        }""",
        # two varying operands
        "two inputs": """
        agraph (float[2, 8] x, float[2, 8] w) => (float[2, 4] y) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Add(x, w)
          y = Slice(t, s, e, a)
        }""",
    }
    for why, body in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 17]>' + body
        _, after, rewrites = run(text)
        assert rewrites == 0, why
        assert node_ops(after) == node_ops(model_from_text(text)), why


def test_reversing_slice_reverses_the_constant_too():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 4] x) => (float[N, 4] y)
      <float[4] b = {1, 2, 3, 4}, int64[1] s = {-1}, int64[1] e = {-100}, int64[1] a = {1}, int64[1] t = {-1}> {
      m = Mul(x, b)
      y = Slice(m, s, e, a, t)
    }
    """
    before, after, _ = run(text)
    assert node_ops(after) == ["Slice", "Mul"]
    np.testing.assert_array_equal(after.graph.node(1).inputs[1].const_value.numpy(), [4, 3, 2, 1])
    assert verify(before, after, dims={"N": 2}, rtol=0.0, atol=0.0).passed


def test_gather_1d_index_and_out_of_range_index():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[3, 5] x) => (float[3, 2] y) <float[5] b = {1, 2, 3, 4, 5}, int64[2] i = {4, 0}> {
      m = Sub(x, b)
      y = Gather<axis = 1>(m, i)
    }
    """
    before, after, _ = run(text)
    assert node_ops(after) == ["Gather", "Sub"]
    np.testing.assert_array_equal(after.graph.node(1).inputs[1].const_value.numpy(), [5, 1])
    assert verify(before, after, rtol=0.0, atol=0.0).passed
    bad = text.replace("{4, 0}", "{7, 0}")
    model = model_from_text(bad)
    ReorderCrop()(model)  # must not raise; the model keeps failing where it failed before
    assert node_ops(model) == ["Sub", "Gather"]
