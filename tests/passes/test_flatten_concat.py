"""flatten-concat: nested Concats on one axis become one Concat."""

from __future__ import annotations

from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes.flatten_concat import FlattenConcat
from modelpress.verify import verify


def run(text: str):
    model = model_from_text(text)
    p = FlattenConcat()
    p(model)
    return model_from_text(text), model, p.rewrites


def test_nested_tree_flattens_in_order():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    agraph (float[N, 1] a, float[N, 2] b, float[N, 3] c, float[N, 4] d) => (float[N, 10] y) {
      ab = Concat<axis = 1>(a, b)
      abc = Concat<axis = -1>(ab, c)
      y = Concat<axis = 1>(d, abc)
    }
    """
    before, after, rewrites = run(text)
    assert rewrites == 2
    assert_graph_equal(
        after,
        """
        <ir_version: 8, opset_import: ["" : 13]>
        agraph (float[N, 1] a, float[N, 2] b, float[N, 3] c, float[N, 4] d) => (float[N, 10] y) {
          y = Concat<axis = 1>(d, a, b, c)
        }
        """,
    )
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


NO_INNER = "no inner Concat of this graph on the same axis is read by this one only"


def test_must_not_fire():
    cases = {
        "other axis": """
        agraph (float[2, 2] a, float[2, 2] b, float[2, 4] c) => (float[4, 4] y) {
          ab = Concat<axis = 0>(a, b)
          y = Concat<axis = 1>(ab, c)
        }""",
        "inner used twice": """
        agraph (float[2, 2] a, float[2, 2] b) => (float[2, 8] y) {
          ab = Concat<axis = 1>(a, b)
          y = Concat<axis = 1>(ab, ab)
        }""",
        "inner is an output": """
        agraph (float[2, 2] a, float[2, 2] b, float[2, 2] c) => (float[2, 6] y, float[2, 4] ab) {
          ab = Concat<axis = 1>(a, b)
          y = Concat<axis = 1>(ab, c)
        }""",
    }
    for why, body in cases.items():
        text = '<ir_version: 8, opset_import: ["" : 13]>' + body
        model = model_from_text(text)
        assert refusals(model, "flatten-concat") == [NO_INNER], why
        assert_graph_equal(model, text)
