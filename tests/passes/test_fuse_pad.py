"""fuse-pad: a zero constant Pad of the spatial axes folds into Conv / AveragePool / MaxPool pads."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text, node_ops

from modelpress.passes import optimize
from modelpress.verify import verify

PASSES = ["fuse-pad", "dead-code"]
W = "{" + ",".join(repr(float(v)) for v in np.random.default_rng(1).standard_normal(4 * 3 * 3 * 3)) + "}"


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


@pytest.mark.parametrize(
    "body, op, opset",
    [
        ("xp = Pad(x, p)\n y = Conv <pads = [1, 0, 0, 1]> (xp, Wt)", "Conv", 17),
        ("xp = Pad(x, p, zero)\n y = Conv(xp, Wt)", "Conv", 13),
        ("xp = Pad <pads = [0, 0, 1, 2, 0, 0, 2, 1]> (x)\n y = Conv(xp, Wt)", "Conv", 10),
        ("xp = Pad(x, p)\n y = AveragePool <kernel_shape = [3, 3], count_include_pad = 1> (xp)", "AveragePool", 17),
        ("r = Relu(x)\n xp = Pad(r, p)\n y = MaxPool <kernel_shape = [3, 3], strides = [2, 2]> (xp)", "MaxPool", 17),
        ("r = Clip(x, zero)\n xp = Pad(r, p)\n y = MaxPool <kernel_shape = [3, 3]> (xp)", "MaxPool", 17),
    ],
)
def test_pad_folds(body, op, opset):
    before, result = run(model(body, opset=opset))
    assert node_ops(result.model)[-1:] == [op] and "Pad" not in node_ops(result.model)
    check = verify(before, result.model, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


def test_pads_attribute_is_summed():
    _, result = run(model("xp = Pad(x, p)\n y = Conv <pads = [1, 0, 0, 1]> (xp, Wt)"))
    conv = result.model.graph.node(0)
    assert list(conv.attributes["pads"].value) == [2, 2, 2, 2]


def test_opset18_axes_input():
    body = "xp = Pad(x, p2, zero, ax)\n y = Conv(xp, Wt)"
    before, result = run(model(body, opset=18, extra_inits=", int64[4] p2 = {1, 0, 2, 1}, int64[2] ax = {-1, 2}"))
    assert node_ops(result.model) == ["Conv"]
    # axes [-1, 2] (= [3, 2]): begins [1, 0], ends [2, 1] → conv pads (H: 0, 1; W: 1, 2)
    assert list(result.model.graph.node(0).attributes["pads"].value) == [0, 1, 1, 2]
    check = verify(before, result.model, rtol=1e-6, atol=1e-6)
    assert check.passed, check.to_dict()


@pytest.mark.parametrize(
    "why, body, inits",
    [
        ("non-zero pad value", "xp = Pad(x, p, one)\n y = Conv(xp, Wt)", ", float one = {1}"),
        ("reflect mode", "xp = Pad <mode = \"reflect\"> (x, p)\n y = Conv(xp, Wt)", ""),
        ("pads the channel axis", "xp = Pad(x, pc)\n y = Conv(xp, Wt)", ", int64[8] pc = {0, 1, 1, 1, 0, 0, 1, 1}"),
        ("negative pad (a crop)", "xp = Pad(x, pn)\n y = Conv(xp, Wt)", ", int64[8] pn = {0, 0, -1, 1, 0, 0, 1, 1}"),
        ("auto_pad", "xp = Pad(x, p)\n y = Conv <auto_pad = \"SAME_UPPER\"> (xp, Wt)", ""),
        ("MaxPool input may be negative", "xp = Pad(x, p)\n y = MaxPool <kernel_shape = [3, 3]> (xp)", ""),
        ("AveragePool excludes pads", "xp = Pad(x, p)\n y = AveragePool <kernel_shape = [3, 3]> (xp)", ""),
        ("pool pads would reach the kernel", "xp = Pad(x, p)\n y = AveragePool <kernel_shape = [2, 2], count_include_pad = 1> (xp)", ""),
        ("padded value read twice", "xp = Pad(x, p)\n c = Conv(xp, Wt)\n y = Add(xp, xp)", ""),
    ],
)
def test_must_not_fire(why, body, inits):
    _, result = run(model(body, extra_inits=inits))
    assert "Pad" in node_ops(result.model), why
    assert result.passes[0].rewrites == 0
