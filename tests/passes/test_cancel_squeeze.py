"""cancel-squeeze: Squeeze/Unsqueeze pairs cancel, runs merge, in both opset forms."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes.cancel_squeeze import CancelSqueeze
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = CancelSqueeze()
    p(model)
    return model_from_text(text), model, p.rewrites


def test_unsqueeze_then_squeeze_cancels_opset13():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[N, 3] x) => (float[N, 3] y) <int64[2] a = {-1, 1}, int64[2] b = {1, 3}> {
      u = Unsqueeze(x, a)
      s = Squeeze(u, b)
      y = Relu(s)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    assert_graph_equal(
        after,
        """
        <ir_version: 8, opset_import: ["" : 13]>
        agraph (float[N, 3] x) => (float[N, 3] y) <int64[2] a = {-1, 1}, int64[2] b = {1, 3}> {
          y = Relu(x)
        }
        """,
    )
    assert verify(before, after, dims={"N": 2}, rtol=0.0, atol=0.0).passed


def test_squeeze_then_unsqueeze_cancels_opset11_attributes_and_keeps_output_name():
    text = """
    <ir_version: 6, opset_import: ["" : 11]>
    agraph (float[2, 3] x) => (float[2, 1, 3] y) {
      u = Unsqueeze<axes = [1]>(x)
      s = Squeeze<axes = [-2]>(u)
      y = Unsqueeze<axes = [1]>(s)
    }
    """
    before, after, _ = run(text)
    # Squeeze∘Unsqueeze cancels first; the output Unsqueeze then reads x directly.
    assert_graph_equal(
        after,
        """
        <ir_version: 6, opset_import: ["" : 11]>
        agraph (float[2, 3] x) => (float[2, 1, 3] y) {
          y = Unsqueeze<axes = [1]>(x)
        }
        """,
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_unsqueezes_merge():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, 3] x) => (float[1, 2, 1, 1, 3] y) <int64[1] a = {0}, int64[2] b = {2, -2}> {
      u = Unsqueeze(x, a)
      y = Unsqueeze(u, b)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 1
    # u: [1, 2, 3]; b (rank 5) = {2, 3}; u's axes sit at the free positions 0, 1, 4 → a → 0.
    assert_graph_equal(
        after,
        """
        <ir_version: 8, opset_import: ["" : 13]>
        agraph (float[2, 3] x) => (float[1, 2, 1, 1, 3] y)
        <int64[1] a = {0}, int64[2] b = {2, -2}, int64[3] merged = {0, 2, 3}> {
          y = Unsqueeze(x, merged)
        }
        """,
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_squeezes_merge_opset11():
    text = """
    <ir_version: 6, opset_import: ["" : 11]>
    agraph (float[1, 2, 1, 3, 1] x) => (float[2, 3] y) {
      s = Squeeze<axes = [2]>(x)
      y = Squeeze<axes = [0, 3]>(s)
    }
    """
    before, after, _ = run(text)
    assert_graph_equal(
        after,
        """
        <ir_version: 6, opset_import: ["" : 11]>
        agraph (float[1, 2, 1, 3, 1] x) => (float[2, 3] y) {
          y = Squeeze<axes = [0, 2, 4]>(x)
        }
        """,
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


def test_squeeze_all_with_static_shape_cancels():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, 3] x) => (float[2, 3] y) <int64[1] a = {0}> {
      u = Unsqueeze(x, a)
      s = Squeeze(u)
      y = Neg(s)
    }
    """
    before, after, _ = run(text)
    assert_graph_equal(
        after,
        text.replace("u = Unsqueeze(x, a)\n      s = Squeeze(u)\n      y = Neg(s)", "y = Neg(x)"),
    )
    assert verify(before, after, rtol=0.0, atol=0.0).passed


UNKNOWN_AXES = "the axes are unknown: not constants, negative with an unknown rank, or all size-1 axes of a dynamic shape"


def test_must_not_fire():
    cases = {
        "Unsqueeze axes [0] and Squeeze axes [2] differ": """
        agraph (float[2, 3] x) => (float[2, 3] y) <int64[1] a = {0}, int64[1] b = {2}> {
          u = Unsqueeze(x, a)
          y = Squeeze(u, b)
        }""",
        # squeeze every size-1 axis of a tensor whose dims may be 1
        UNKNOWN_AXES: """
        agraph (float[N, 3] x) => (float[N, 3] y) <int64[1] a = {0}> {
          u = Unsqueeze(x, a)
          y = Squeeze(u)
        }""",
        # axes computed at run time
        UNKNOWN_AXES + " ": """
        agraph (float[2, 3] x, int64[1] a) => (float[2, 3] y) <int64[1] b = {0}> {
          u = Unsqueeze(x, a)
          y = Squeeze(u, b)
        }""",
    }
    for reason, body in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 13]>' + body
        model = model_from_text(text)
        assert refusals(model, "cancel-squeeze") == [reason.strip()]
        assert_graph_equal(model, text)


def test_negative_axes_with_unknown_rank_are_left_alone():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[2, 3] x) => (float[2, 3] y) <int64[1] a = {-1}, int64[1] b = {2}> {
      u = Unsqueeze(x, a)
      y = Squeeze(u, b)
    }
    """

    def without_shapes():
        model = model_from_text(text)
        model.graph.inputs[0].shape = None
        for node in model.graph:
            node.outputs[0].shape = None
        return model

    model = without_shapes()
    assert refusals(model, "cancel-squeeze") == [UNKNOWN_AXES]
    assert_graph_equal(model, without_shapes())
