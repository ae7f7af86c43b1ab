"""fuse-pad: a zero constant Pad of the spatial axes folds into Conv / AveragePool / MaxPool pads."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import assert_graph_equal, model_from_text, refusals

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-pad", "dead-code"]
W = (
    "{"
    + ",".join(repr(float(v)) for v in np.random.default_rng(1).standard_normal(4 * 3 * 3 * 3))
    + "}"
)


def model(body: str, *, opset: int = 17, extra_inits: str = "") -> str:
    return f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, 3, 8, 8] x) => (float[2, C, H, W] y)
    <float[4, 3, 3, 3] Wt = {W}, int64[8] p = {{0, 0, 1, 2, 0, 0, 2, 1}}, float zero = {{0}}{extra_inits}> {{
      {body}
    }}
    """


def run(text: str):
    before = model_from_text(text)
    return before, optimize(model_from_text(text), passes=PASSES)


def expected(body: str, *, opset: int = 17, inits: str = "") -> str:
    """The graph ``body`` with the initializers it reads (Wt, when it has a Conv)."""
    weights = f"float[4, 3, 3, 3] Wt = {W}" if "Conv" in body else ""
    inits = f"<{', '.join(i for i in (weights, inits) if i)}>" if weights or inits else ""
    return f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, 3, 8, 8] x) => (float[2, C, H, W] y) {inits} {{
      {body}
    }}
    """


@pytest.mark.parametrize(
    "body, opset, folded",
    [
        (
            "xp = Pad(x, p)\n y = Conv <pads = [1, 0, 0, 1]> (xp, Wt)",
            17,
            "y = Conv <pads = [2, 2, 2, 2]> (x, Wt)",
        ),
        ("xp = Pad(x, p, zero)\n y = Conv(xp, Wt)", 13, "y = Conv <pads = [1, 2, 2, 1]> (x, Wt)"),
        (
            "xp = Pad <pads = [0, 0, 1, 2, 0, 0, 2, 1]> (x)\n y = Conv(xp, Wt)",
            10,
            "y = Conv <pads = [1, 2, 2, 1]> (x, Wt)",
        ),
        (
            "xp = Pad(x, p)\n y = AveragePool <kernel_shape = [3, 3], count_include_pad = 1> (xp)",
            17,
            "y = AveragePool <kernel_shape = [3, 3], count_include_pad = 1, pads = [1, 2, 2, 1]> (x)",
        ),
        (
            "r = Relu(x)\n xp = Pad(r, p)\n y = MaxPool <kernel_shape = [3, 3], strides = [2, 2]> (xp)",
            17,
            "r = Relu(x)\n y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 2, 2, 1]> (r)",
        ),
    ],
)
def test_pad_folds(body, opset, folded):
    before, result = run(model(body, opset=opset))
    assert_graph_equal(result.model, expected(folded, opset=opset))
    check = verify(before, result.model, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


def test_pad_of_a_clip_at_zero_folds_into_maxpool():
    before, result = run(
        model("r = Clip(x, zero)\n xp = Pad(r, p)\n y = MaxPool <kernel_shape = [3, 3]> (xp)")
    )
    assert_graph_equal(
        result.model,
        expected(
            "r = Clip(x, zero)\n y = MaxPool <kernel_shape = [3, 3], pads = [1, 2, 2, 1]> (r)",
            inits="float zero = {0}",
        ),
    )
    check = verify(before, result.model, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


def test_pads_attribute_is_summed():
    _, result = run(model("xp = Pad(x, p)\n y = Conv <pads = [1, 0, 0, 1]> (xp, Wt)"))
    conv = result.model.graph.node(0)
    assert list(conv.attributes["pads"].value) == [2, 2, 2, 2]


def test_opset18_axes_input():
    body = "xp = Pad(x, p2, zero, ax)\n y = Conv(xp, Wt)"
    before, result = run(
        model(body, opset=18, extra_inits=", int64[4] p2 = {1, 0, 2, 1}, int64[2] ax = {-1, 2}")
    )
    # axes [-1, 2] (= [3, 2]): begins [1, 0], ends [2, 1] → conv pads (H: 0, 1; W: 1, 2)
    assert_graph_equal(result.model, expected("y = Conv <pads = [0, 1, 1, 2]> (x, Wt)", opset=18))
    check = verify(before, result.model, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "reason, body, inits",
    [
        (
            "the Pad is not a constant-mode zero padding with constant pads",
            "xp = Pad(x, p, one)\n y = Conv(xp, Wt)",
            ", float one = {1}",
        ),
        (
            "the Pad is not a constant-mode zero padding with constant pads",
            'xp = Pad <mode = "reflect"> (x, p)\n y = Conv(xp, Wt)',
            "",
        ),
        (
            "the Pad pads the batch or channel axis, which is no convolution padding",
            "xp = Pad(x, pc)\n y = Conv(xp, Wt)",
            ", int64[8] pc = {0, 1, 1, 1, 0, 0, 1, 1}",
        ),
        (
            "the Pad crops (negative pads)",
            "xp = Pad(x, pn)\n y = Conv(xp, Wt)",
            ", int64[8] pn = {0, 0, -1, 1, 0, 0, 1, 1}",
        ),
        (
            "the Conv has auto_pad, not explicit pads",
            'xp = Pad(x, p)\n y = Conv <auto_pad = "SAME_UPPER"> (xp, Wt)',
            "",
        ),
        (
            "the input is not known to be non-negative: MaxPool pads with -inf, not 0",
            "xp = Pad(x, p)\n y = MaxPool <kernel_shape = [3, 3]> (xp)",
            "",
        ),
        (
            "the AveragePool does not count its own padding (count_include_pad=0)",
            "xp = Pad(x, p)\n y = AveragePool <kernel_shape = [3, 3]> (xp)",
            "",
        ),
        (
            "the combined pads would reach the AveragePool's kernel size",
            "xp = Pad(x, p)\n y = AveragePool <kernel_shape = [2, 2], count_include_pad = 1> (xp)",
            "",
        ),
        (
            "the padded value has other readers or is a graph output",
            "xp = Pad(x, p)\n c = Conv(xp, Wt)\n y = Add(xp, xp)",
            "",
        ),
    ],
)
def test_must_not_fire(reason, body, inits):
    text = model(body, extra_inits=inits)
    m = model_from_text(text)
    assert refusals(m, "fuse-pad") == [reason]
    assert_graph_equal(m, text)
