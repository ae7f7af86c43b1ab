"""reorder-crop: Slice / Gather move ahead of element-wise ops, cropping constants with them."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes.reorder_crop import ReorderCrop
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = ReorderCrop()
    p(model)
    return model_from_text(text), model, p.rewrites


def moved(text: str, old: str, new: str, inits: str = "") -> str:
    """``text`` with the body ``old`` replaced by ``new`` and the initializers ``inits`` added (the
    uncropped constants stay: removing them is dead-code elimination's business)."""
    assert old in text
    text = text.replace(old, new)
    if inits:
        head, sep, rest = text.partition("> {")
        text = f"{head}, {inits}{sep}{rest}"
    return text


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
    assert_graph_equal(
        after,
        moved(
            text,
            "r = Relu(x)\n      g = Sigmoid(r)\n      y = Slice(g, s, e, a)",
            "c = Slice(x, s, e, a)\n r = Relu(c)\n y = Sigmoid(r)",
        ),
    )
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
    assert_graph_equal(
        after,
        moved(
            text,
            "t = Add(x, b)\n      y = Slice(t, s, e, a)",
            "c = Slice(x, s, e, a)\n y = Add(c, bc)",
            "float[4] bc = {2, 3, 4, 5}",
        ),
    )
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
    # operand order kept (c first)
    assert_graph_equal(
        after,
        moved(
            text,
            "t = Mul(c, x)\n      y = Gather<axis = 1>(t, i)",
            "g = Gather<axis = 1>(x, i)\n y = Mul(cc, g)",
            "float[1] cc = {30}",
        ),
    )
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
    assert_graph_equal(
        after,
        moved(
            text,
            "t = Exp(x)\n      y = Slice(t, s0, e0, a)\n      z = Slice(t, s1, e1, a)",
            "c0 = Slice(x, s0, e0, a)\n y = Exp(c0)\n c1 = Slice(x, s1, e1, a)\n z = Exp(c1)",
        ),
    )
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
    assert_graph_equal(
        after,
        moved(
            text,
            "t = Clip<min = -0.5, max = 0.5>(x)\n      y = Slice<starts = [1], ends = [5], axes = [1]>(t)",
            "c = Slice<starts = [1], ends = [5], axes = [1]>(x)\n y = Clip<min = -0.5, max = 0.5>(c)",
        ),
    )
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
    assert_graph_equal(
        after,
        moved(
            text,
            "t = Clip(x, lo, hi)\n      y = Slice(t, s, e, a, st)",
            "c = Slice(x, s, e, a, st)\n y = Clip(c, lo, hi)",
        ),
    )
    assert verify(before, after, dims={"N": 4}, rtol=0.0, atol=0.0).passed


NOT_A_CROP = "a reader of the Relu result is not a crop with constant parameters"


def test_must_not_fire():
    cases = {
        # the element-wise result has another, non-crop user
        "other use": (
            [NOT_A_CROP],
            """
        agraph (float[2, 8] x) => (float[2, 4] y, float[2, 8] z) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Relu(x)
          y = Slice(t, s, e, a)
          z = Neg(t)
        }""",
        ),
        # x may be 1 along the cropped axis and broadcast against the constant
        "broadcast": (
            ["a constant varies along axis 1, where x is not known to have its size"],
            """
        agraph (float[2, M] x) => (float[2, 4] y) <float[8] b = {0, 1, 2, 3, 4, 5, 6, 7}, int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Add(x, b)
          y = Slice(t, s, e, a)
        }""",
        ),
        # slice bounds computed at run time
        "dynamic bounds": (
            [NOT_A_CROP],
            """
        agraph (float[2, 8] x, int64[1] e) => (float[2, M] y) <int64[1] s = {0}, int64[1] a = {1}> {
          t = Relu(x)
          y = Slice(t, s, e, a)
        }""",
        ),
        # not element-wise: not the pattern, nothing to refuse
        "softmax": (
            [],
            """
        agraph (float[2, 8] x) => (float[2, 4] y) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Softmax<axis = 1>(x)
          y = Slice(t, s, e, a)
        }""",
        ),
        # overlapping crops keep more than the op computes: duplicating it would add work
        "overlap": (
            ["cropping first would not compute fewer elements"] * 2,
            """
        agraph (float[2, 8] x) => (float[2, 6] y, float[2, 6] z) <int64[1] s0 = {0}, int64[1] e0 = {6}, int64[1] s1 = {2}, int64[1] e1 = {8}, int64[1] a = {1}> {
          t = Exp(x)
          y = Slice(t, s0, e0, a)
          z = Slice(t, s1, e1, a)
        }""",
        ),
        "two inputs": (
            ["the Add has 2 non-constant operands, not one"],
            """
        agraph (float[2, 8] x, float[2, 8] w) => (float[2, 4] y) <int64[1] s = {0}, int64[1] e = {4}, int64[1] a = {1}> {
          t = Add(x, w)
          y = Slice(t, s, e, a)
        }""",
        ),
    }
    for why, (reasons, body) in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 17]>' + body
        model = model_from_text(text)
        assert refusals(model, "reorder-crop") == reasons, why
        assert_graph_equal(model, text)


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
    assert_graph_equal(
        after,
        moved(
            text,
            "m = Mul(x, b)\n      y = Slice(m, s, e, a, t)",
            "c = Slice(x, s, e, a, t)\n y = Mul(c, bc)",
            "float[4] bc = {4, 3, 2, 1}",
        ),
    )
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
    assert_graph_equal(
        after,
        moved(
            text,
            "m = Sub(x, b)\n      y = Gather<axis = 1>(m, i)",
            "g = Gather<axis = 1>(x, i)\n y = Sub(g, bc)",
            "float[2] bc = {5, 1}",
        ),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed
    bad = text.replace("{4, 0}", "{7, 0}")
    model = model_from_text(bad)
    # must not raise; the model keeps failing where it failed before
    assert refusals(model, "reorder-crop") == [
        "an index is out of range: the model fails at run time, and is left so"
    ]
    assert_graph_equal(model, bad)
