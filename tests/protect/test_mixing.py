"""Weight mixing (``mixing.py``): each covered layer (Conv, grouped Conv, MatMul, Gemm with
transB and a bias, an embedding Gather) computes bit for bit what it did once the run-time values
are given; the stored weight is a derangement (no slice left in place) and correlates with the
original only by chance; the values come back from their spec alone; what the rule does not
cover (a small weight, a depthwise Conv, a shared weight) is left alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from modelpress.ir import from_proto
from modelpress.protect import mixing
from modelpress.protect.correlation import correlation
from modelpress.runtime.ort import session

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 16, 6, 6] x, float[2, 3, 128] t, int64[2, 3] ids) => (float[2, 128, 6, 6] c,
   float[2, 128, 6, 6] d, float[2, 3, 256] m, float[2, 3, 128] e, float[3, 160] h) {
    c = Conv <pads = [1, 1, 1, 1]> (x, wc, bc)
    d = Conv <group = 2> (c, wg)
    m = MatMul (t, wm)
    e = Gather (table, ids)
    flat = Reshape (t, shape)
    h = Gemm <transB = 1> (flat, wh, bh)
}
"""


def _with(text: str, arrays: dict[str, np.ndarray]) -> ir.Model:
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    onnx.checker.check_model(proto)
    return from_proto(proto)


def _model() -> ir.Model:
    rng = np.random.default_rng(0)
    shapes = {
        "wc": (128, 16, 3, 3),
        "bc": (128,),
        "wg": (128, 64, 1, 1),  # 8,192 elements: left alone,
        "wm": (128, 256),
        "table": (200, 128),
        "wh": (160, 128),
        "bh": (160,),
    }
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    arrays["shape"] = np.array([-1, 128], np.int64)
    return _with(TEXT, arrays)


def _feeds():
    rng = np.random.default_rng(1)
    return {
        "x": rng.standard_normal((2, 16, 6, 6)).astype(np.float32),
        "t": rng.standard_normal((2, 3, 128)).astype(np.float32),
        "ids": rng.integers(-200, 200, (2, 3)).astype(np.int64),
    }


def _mixed():
    model = _model()
    before = {n: v.const_value.numpy().copy() for n, v in model.graph.initializers.items()}
    specs: dict[str, dict] = {}
    names = iter(f"n{i}" for i in range(1000))

    def secret(spec, dtype, rank):
        value = ir.Value(name=next(names), type=ir.TensorType(dtype), shape=ir.Shape([None] * rank))
        model.graph.inputs.append(value)
        specs[value.name] = spec
        return value

    done = mixing.mix(
        model.graph, rng=np.random.default_rng(2), secret=secret, new_name=lambda: next(names)
    )
    return model, before, specs, done


def test_every_covered_layer_computes_what_it_did():
    original = _model()
    model, _, specs, done = _mixed()
    assert done == 4  # the grouped Conv's weight is too small
    want = session(original).run(None, _feeds())
    values = {name: mixing.values(spec) for name, spec in specs.items()}
    got = session(model).run(None, {**_feeds(), **values})
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)  # shuffles and sign flips: exact


def test_the_stored_weights_are_deranged_and_uncorrelated():
    model, before, _, _ = _mixed()
    stored = [
        v.const_value.numpy()
        for n, v in model.graph.initializers.items()
        if n not in before and v.const_value.size >= mixing.MIN_ELEMENTS
    ]
    assert len(stored) == 4
    for s in stored:
        same = [w for w in before.values() if w.size == s.size]
        for w in same:
            assert correlation(s, w) < 4 / np.sqrt(s.size)  # chance: 4 standard deviations
            assert correlation(np.abs(s), np.abs(w)) < 0.5  # nothing left in place


def test_a_layer_the_rule_does_not_cover_is_left_alone():
    rng = np.random.default_rng(0)
    shapes = {"dw": (8, 1, 3, 3), "small": (128, 8), "shared": (128, 128)}
    model = _with(
        """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 4, 4] x, float[1, 128] t) => (float[1, 8, 4, 4] y, float[1, 8] a,
                                                   float[1, 128] b, float[1, 128] c) {
        y = Conv <group = 8> (x, dw)
        a = MatMul (t, small)
        b = MatMul (t, shared)
        c = MatMul (t, shared)
    }
    """,
        {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()},
    )
    done = mixing.mix(
        model.graph, rng=rng, secret=lambda *a: pytest.fail("no secret"), new_name=str
    )
    assert done == 0


@pytest.mark.parametrize("n, block", [(128, 128), (128, 64), (7, 7), (1, 1)])
def test_derangements_leave_nothing_in_place_and_values_repeat(n, block):
    q = mixing.derangement("ab" * 16, n, block)
    assert sorted(q) == list(range(n))
    assert (q // block == np.arange(n) // block).all()  # within each block
    if n > 1:
        assert not (q == np.arange(n)).any()
    spec = {"seed": "cd" * 16, "n": n, "part": "index"}
    np.testing.assert_array_equal(mixing.values(spec), mixing.values(dict(spec)))
