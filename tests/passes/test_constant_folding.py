"""constant-folding: nodes computable from constants become initializers, within a size cap."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mp_testing import assert_graph_equal, model_from_text, node_ops, refusals

from modelpress.passes import constant_folding, optimize
from modelpress.verify import verify

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def fold(text: str, *extra: str):
    before = model_from_text(text)
    after = model_from_text(text)
    result = optimize(after, passes=["constant-folding", *extra, "dead-code"])
    return before, result


SHAPE_ARITHMETIC = f"""
{HEADER}
g (float[N, 3, 4] x) => (float[N, 12] y, float[3] d) <float[3] a = {{1, 2, 3}}, float[3] b = {{4, 5, 6}}> {{
  c = Add(a, b)
  d = Mul(c, c)
  sh = Shape(x)
  one = Constant<value = int64[1] {{1}}>()
  three = Constant<value = int64[1] {{3}}>()
  tail = Slice(sh, one, three)
  p = ReduceProd<keepdims = 1>(tail)
  m1 = Constant<value = int64[1] {{-1}}>()
  shp = Concat<axis = 0>(m1, p)
  r = Reshape(x, shp)
  y = Relu(r)
}}
"""


def test_constant_arithmetic_and_static_part_of_a_dynamic_shape_fold():
    before, result = fold(SHAPE_ARITHMETIC)
    after = result.model
    # the graph outputs keep their names, and N stays dynamic
    assert_graph_equal(
        after,
        f"""
        {HEADER}
        g (float[N, 3, 4] x) => (float[N, 12] y, float[3] d) <int64[2] shp = {{-1, 12}}> {{
          d = Constant<value = float[3] {{25, 49, 81}}>()
          r = Reshape(x, shp)
          y = Relu(r)
        }}
        """,
    )
    for n in (1, 4):
        assert verify(before, after, dims={"N": n}, rtol=0.0, atol=0.0).passed


def test_dynamic_dimension_is_not_folded():
    text = f"""
    {HEADER}
    g (float[N, 4] x) => (float[M, 1] y) <int64 zero = {{0}}, int64[1] ax = {{0}}, int64[1] one = {{1}}> {{
      sh = Shape(x)
      n = Gather(sh, zero)
      nn = Unsqueeze(n, ax)
      shp = Concat<axis = 0>(nn, one)
      r = ReduceSum<keepdims = 0>(x, one)
      y = Reshape(r, shp)
    }}
    """
    before, result = fold(text)
    assert_graph_equal(result.model, text)
    assert refusals(model_from_text(text), "constant-folding") == []  # nothing was foldable
    assert verify(before, result.model, dims={"N": 5}, rtol=0.0, atol=0.0).passed


@pytest.mark.parametrize(
    "body, out, folds",
    [
        # 1024 x 1024 floats (4 MiB) from 16 bytes of shape: over the cap, stays
        (
            "big = ConstantOfShape<value = float[1] {1.0}>(s1024)\n y = Add(x, big)",
            "float[1024, 1024]",
            False,
        ),
        ("big = Expand(one, s1024)\n y = Add(x, big)", "float[1024, 1024]", False),
        # 64 x 64 floats (16 KiB): under the 1 MiB floor, folds
        (
            "small = ConstantOfShape<value = float[1] {1.0}>(s64)\n y = Add(x, small)",
            "float[64, 64]",
            True,
        ),
    ],
)
def test_size_cap(body, out, folds):
    x_shape = "1024, 1024" if "1024" in out else "64, 64"
    text = f"""
    {HEADER}
    g (float[{x_shape}] x) => ({out} y)
    <int64[2] s1024 = {{1024, 1024}}, int64[2] s64 = {{64, 64}}, float one = {{1.0}}> {{
      {body}
    }}
    """
    _, result = fold(text)
    assert (node_ops(result.model) == ["Add"]) is folds
    assert result.passes[0].rewrites == (1 if folds else 0)
    if folds:
        ones = "{" + ",".join(["1.0"] * 64 * 64) + "}"
        assert_graph_equal(
            result.model,
            f"""
            {HEADER}
            g (float[64, 64] x) => (float[64, 64] y) <float[64, 64] small = {ones}> {{
              y = Add(x, small)
            }}
            """,
        )
    else:
        model = model_from_text(text)
        assert refusals(model, "constant-folding") == [
            "its result would be over the cap of 1048576 bytes"
        ]
        assert_graph_equal(model, text)


def test_folding_a_large_weight_transpose_is_allowed_up_to_the_inputs_size():
    # A Transpose of a 2 MiB weight yields 2 MiB: no bigger than its input, so it folds.
    model = model_from_text(f"""
    {HEADER}
    g (float[2, 1024] x) => (float[2, 512] y) <float[1, 1] w = {{0}}> {{
      wt = Transpose<perm = [1, 0]>(w)
      y = MatMul(x, wt)
    }}
    """)
    # the real weight is set in numpy: as text it would be megabytes long
    w = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
    init = model.graph.initializers["w"]
    init.const_value = ir.tensor(w, name="w")
    init.shape = ir.Shape(w.shape)
    result = optimize(model, passes=["constant-folding", "dead-code"])
    expected = model_from_text(f"""
    {HEADER}
    g (float[2, 1024] x) => (float[2, 512] y) <float[1, 1] wt = {{0}}> {{
      y = MatMul(x, wt)
    }}
    """)
    expected.graph.initializers["wt"].const_value = ir.tensor(np.ascontiguousarray(w.T), name="wt")
    assert_graph_equal(result.model, expected, rtol=0, atol=0)


def test_random_and_quantization_ops_are_not_folded():
    text = f"""
    {HEADER}
    g (float[2, 3] x) => (float[2, 3] y, float[2, 3] z)
    <int8[2, 3] q = {{1, 2, 3, 4, 5, 6}}, float s = {{0.5}}, int8 zp = {{0}}> {{
      r = RandomNormalLike<seed = 1.0>(x)
      y = Add(x, r)
      w = DequantizeLinear(q, s, zp)
      z = Mul(x, w)
    }}
    """
    _, result = fold(text)
    assert result.passes[0].rewrites == 0
    assert_graph_equal(result.model, text)
    # the random op reads x, which is no constant: only the DequantizeLinear was a candidate
    assert refusals(model_from_text(text), "constant-folding") == [
        "it holds a quantized weight, which runtimes fuse into integer kernels"
    ]


def test_if_branch_constants_fold_inside_the_branch():
    text = f"""
    {HEADER}
    g (bool c, float[N, 2] x) => (float[N, 2] y) <float[2] a = {{1, 2}}> {{
      y = If(c) <then_branch = g1 () => (float[N, 2] t) {{
                   two = Constant<value = float[2] {{2, 2}}>()
                   k = Mul(a, two)
                   t = Add(x, k)
                 }},
                 else_branch = g2 () => (float[N, 2] e) {{ e = Neg(x) }}>
    }}
    """
    before, result = fold(text)
    assert_graph_equal(
        result.model,
        f"""
        {HEADER}
        g (bool c, float[N, 2] x) => (float[N, 2] y) {{
          y = If(c) <then_branch = g1 () => (float[N, 2] t) <float[2] k = {{2, 4}}> {{ t = Add(x, k) }},
                     else_branch = g2 () => (float[N, 2] e) {{ e = Neg(x) }}>
        }}
        """,
    )
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    for c in (True, False):
        assert verify(
            before, result.model, data={"c": np.array(c), "x": x}, rtol=0.0, atol=0.0
        ).passed


def test_if_with_a_condition_known_from_static_shapes_becomes_its_branch():
    text = f"""
    {HEADER}
    g (float[N, 4] x) => (float[N, 4] y) <int64 four = {{4}}, float two = {{2.0}}> {{
      sh = Shape(x)
      idx = Constant<value = int64 {{1}}>()
      width = Gather(sh, idx)
      wide = Equal(width, four)
      y = If(wide) <then_branch = g1 () => (float[N, 4] t) {{ t = Mul(x, two) }},
                    else_branch = g2 () => (float[N, 4] e) {{ e = Neg(x) }}>
    }}
    """
    before, result = fold(text)
    after = result.model
    assert_graph_equal(
        after,
        f"""
        {HEADER}
        g (float[N, 4] x) => (float[N, 4] y) <float two = {{2.0}}> {{
          y = Mul(x, two)
        }}
        """,
    )
    assert verify(before, after, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_if_whose_branch_initializer_names_are_taken_is_refused():
    text = f"""
    {HEADER}
    g (float[2] x) => (float[2] y) <bool yes = {{1}}, float[2] k = {{1, 1}}> {{
      y = If(yes) <then_branch = g1 () => (float[2] t) <float[2] k = {{3, 4}}> {{ t = Mul(x, k) }},
                   else_branch = g2 () => (float[2] e) {{ e = Neg(x) }}>
    }}
    """
    model = model_from_text(text)
    assert refusals(model, "constant-folding") == [
        # evaluating the If as a whole fails: its branch reads x, an outer value
        "neither ONNX Runtime nor onnx.reference computed a usable result",
        "the branch's initializers have nowhere to go (a function) or their names are taken",
    ]
    assert_graph_equal(model, text)


def test_onnx_reference_evaluates_what_onnx_runtime_cannot(monkeypatch):
    monkeypatch.setattr(constant_folding._Evaluator, "_ort", staticmethod(lambda model: None))
    before, result = fold(SHAPE_ARITHMETIC)
    assert_graph_equal(
        result.model,
        f"""
        {HEADER}
        g (float[N, 3, 4] x) => (float[N, 12] y, float[3] d) <int64[2] shp = {{-1, 12}}> {{
          d = Constant<value = float[3] {{25, 49, 81}}>()
          r = Reshape(x, shp)
          y = Relu(r)
        }}
        """,
    )
    assert verify(before, result.model, dims={"N": 3}, rtol=0.0, atol=0.0).passed


def test_after_folding_other_passes_see_constants():
    # Shape arithmetic folds to the input's own shape, so the Reshape becomes a no-op.
    before, result = fold(
        f"""
    {HEADER}
    g (float[2, 3] x) => (float[2, 3] y) {{
      sh = Shape(x)
      r = Reshape(x, sh)
      y = Relu(r)
    }}
    """,
        "noop",
    )
    assert_graph_equal(
        result.model,
        f"""
        {HEADER}
        g (float[2, 3] x) => (float[2, 3] y) {{
          y = Relu(x)
        }}
        """,
    )
    assert verify(before, result.model, rtol=0.0, atol=0.0).passed


def _case_inputs_as_constants(case) -> ir.Model | None:
    """The case's model with its (tensor) inputs turned into initializers, or None."""
    import onnx.numpy_helper

    from modelpress.ir import from_proto

    inputs, _ = case.data_sets[0]
    arrays = [onnx.numpy_helper.to_array(v) if hasattr(v, "dims") else v for v in inputs]
    arrays = [np.array(a) if isinstance(a, np.generic) else a for a in arrays]
    if not all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays):
        return None
    model = from_proto(case.model)
    if len(model.graph.inputs) != len(arrays):
        return None
    for value, array in zip(model.graph.inputs, arrays, strict=True):
        value.const_value = ir.tensor(array, name=value.name)
        model.graph.register_initializer(value)
    model.graph.inputs.clear()
    return model


@pytest.mark.slow
def test_every_backend_node_test_folds_to_what_onnxruntime_computes():
    """Make each ONNX node test's inputs constant, fold the whole graph, and compare with what
    ONNX Runtime computes from the unfolded graph: every op (and expanded function) ORT runs is
    evaluated here, with the case's own tolerances."""
    import logging
    import warnings

    from onnx.backend.test.case import node

    from modelpress.ir import to_proto
    from modelpress.runtime.ort import session, session_options

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    options = session_options(optimize="disabled")
    options.log_severity_level = 4
    checked, whole, failures = 0, 0, {}
    for case in cases:
        model = _case_inputs_as_constants(case)
        if model is None or any(isinstance(e, list) or e is None for e in case.data_sets[0][1]):
            continue  # sequence or optional values: not tensors, not foldable
        try:  # only cases ONNX Runtime runs as they are
            reference = session(to_proto(model).SerializeToString(), options=options).run(None, {})
        except Exception:  # noqa: BLE001 - ORT lacks the op, or the case is meant to fail
            continue
        checked += 1
        folded = optimize(model, passes=["constant-folding", "dead-code"]).model
        whole += all(n.op_type == "Constant" for n in folded.graph)
        try:
            got = session(to_proto(folded).SerializeToString(), options=options).run(None, {})
        except Exception as exc:  # noqa: BLE001
            failures[case.name] = str(exc).splitlines()[0][:200]
            continue
        for have, want in zip(got, reference, strict=True):
            want = np.asarray(want)
            rtol = case.rtol
            if want.dtype == np.float16:
                # ORT keeps a chain of fp16 ops in float32 between them when it runs the whole
                # graph, while a folded value is rounded to fp16 after each op, as ONNX specifies:
                # allow one fp16 rounding.
                rtol = max(rtol, 2**-10)
            if want.dtype.kind in "fc":
                ok = np.allclose(have, want, rtol=rtol, atol=case.atol, equal_nan=True)
            else:
                ok = np.array_equal(have, want)
            if not ok:
                failures[case.name] = "differs from ONNX Runtime's result on the unfolded graph"
    assert checked > 1000 and whole > 0.9 * checked, (checked, whole)
    assert not failures, failures
