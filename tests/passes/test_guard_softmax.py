"""guard-softmax: a masked Softmax is clamped to ``max - 80`` and computes the same probabilities."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, model_from_text, node_ops, refusals

from modelpress.passes import optimize
from modelpress.verify import run_model

PASSES = ["guard-softmax"]


def attention(
    opset: int = 17,
    mask_value: str = "-3.4028235e38",
    dtype: str = "float",
    axis: int = -1,
    reader: str = "y = MatMul(p, v)",
):
    """Masked attention probabilities ``p`` read by ``reader``; with ``v`` the identity the output
    is ``p`` itself, so the tests compare probabilities."""
    return f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g ({dtype}[B, 2, 5, 6] scores, bool[B, 1, 1, 6] keep, {dtype}[B, 2, 6, 6] v) => ({dtype}[B, 2, 5, 6] y)
    <{dtype} zero = {{0}}, {dtype} big = {{{mask_value}}}> {{
      mask = Where(keep, zero, big)
      x = Add(scores, mask)
      p = Softmax<axis = {axis}>(x)
      {reader}
    }}
    """


def guarded(opset: int, mask_value: str) -> str:
    """``attention()`` with the Softmax input clamped to ``ReduceMax(x) - 80``."""
    axes = (
        ("<keepdims = 1>(x, axes)", ", int64[1] axes = {-1}")
        if opset >= 18
        else ("<axes = [-1], keepdims = 1>(x)", "")
    )
    return f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g (float[B, 2, 5, 6] scores, bool[B, 1, 1, 6] keep, float[B, 2, 6, 6] v) => (float[B, 2, 5, 6] y)
    <float zero = {{0}}, float big = {{{mask_value}}}, float margin = {{80}}{axes[1]}> {{
      mask = Where(keep, zero, big)
      x = Add(scores, mask)
      peak = ReduceMax{axes[0]}
      floor = Sub(peak, margin)
      clamped = Max(x, floor)
      p = Softmax<axis = -1>(clamped)
      y = MatMul(p, v)
    }}
    """


def feeds(rng, *, spread: float = 1.0):
    scores = (rng.standard_normal((3, 2, 5, 6)) * spread).astype(np.float32)
    keep = rng.random((3, 1, 1, 6)) < 0.5
    keep[0, ..., 0] = True
    keep[1] = False  # a fully masked row: uniform in both
    v = np.broadcast_to(np.eye(6, dtype=np.float32), (3, 2, 6, 6)).copy()
    return {"scores": scores, "keep": keep, "v": v}


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("mask_value", ["-3.4028235e38", "-10000", "-1e9"])
def test_masked_softmax_is_guarded_and_unchanged(rng, opset, mask_value):
    text = attention(opset, mask_value)
    before = model_from_text(text)
    after = optimize(model_from_text(text), passes=PASSES)
    assert after.rewrites == 1
    assert_graph_equal(after.model, guarded(opset, mask_value))
    for spread in (
        1.0,
        40.0,
    ):  # large scores: the clamp must not touch anything within 80 of the max
        f = feeds(rng, spread=spread)
        want = run_model(before, f)["y"]
        got = run_model(after.model, f)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-20)
        # batch 0 keeps key 0: its masked keys get probabilities far below float32 resolution
        masked = ~np.broadcast_to(f["keep"][0], got[0].shape)
        assert not masked.any() or got[0][masked].max() < 1e-30
        np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-6)


def test_second_run_adds_nothing():
    once = optimize(model_from_text(attention()), passes=PASSES).model
    ops = node_ops(once)
    twice = optimize(once, passes=PASSES).model
    assert node_ops(twice) == ops


def attention_float16() -> str:
    """``attention()`` in float16. Its constants are cast from float32: ONNX text reads a float16
    literal as the raw bits, not as a number."""
    text = attention(dtype="float16", mask_value="-60000")
    text = text.replace(
        "<float16 zero = {0}, float16 big = {-60000}>",
        "<float zero32 = {0}, float big32 = {-60000}>",
    )
    return text.replace(
        "mask = Where",
        "zero = Cast<to = 10>(zero32)\n      big = Cast<to = 10>(big32)\n      mask = Where",
    )


NOT_ONLY_MATMUL = "the probabilities are read by more than MatMul/Einsum: e^-80 for 0 would show"


@pytest.mark.parametrize(
    "text, reasons",
    [
        (attention(mask_value="-5"), []),  # an ordinary bias, not a mask: not the pattern
        (attention_float16(), ["not float32: float16's normal range is too short for the margin"]),
        (
            attention(opset=11, axis=1),
            ["before opset 13 the row is everything after axis, and axis is not the last one"],
        ),
        (
            attention(reader="y = Log(p)"),
            [NOT_ONLY_MATMUL],
        ),  # log-probabilities: -inf would become -80
        (attention(reader="y = Identity(p)"), [NOT_ONLY_MATMUL]),  # the probabilities are an output
    ],
    ids=["small-bias", "float16", "opset11-axis1", "log-reader", "output"],
)
def test_left_alone(text, reasons):
    model = model_from_text(text)
    assert refusals(model, "guard-softmax") == reasons
    assert_graph_equal(model, text)
