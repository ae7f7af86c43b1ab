"""Graph expansion: the opaque predicates are zero for every integer the chain can carry, the
decoys read unrelated tensors, and the chain leaves every output value untouched, bit for bit,
even -0.0, NaN and infinities; the runtime cannot drop it (it reaches the outputs)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mp_testing import model_from_text

from modelpress.protect import expand as ex
from modelpress.protect import open_package, protect
from modelpress.protect.branches import Body
from modelpress.runtime.ort import session


@pytest.mark.parametrize("template", [ex._parity, ex._cubic, ex._square, ex._cancel])
def test_each_opaque_predicate_is_zero_for_every_value_it_can_get(template):
    n = ir.Value(name="n", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    graph = ir.Graph([n], [], nodes=[], opset_imports={"": 17})
    out = template(Body(graph), n)
    out.name = "z"
    graph.outputs.append(out)
    sess = session(ir.Model(graph, ir_version=8), optimize="disabled")
    # the chain carries 0 or 1; the predicates hold far beyond that (n(n+1) and 2n - 2n for all)
    values = range(-1000, 1001) if template is not ex._cubic else range(-2000, 2001)
    for v in values:
        assert sess.run(None, {"n": np.array(v, dtype=np.int64)})[0] == 0, v
    if template in (ex._parity, ex._cancel):  # true even where int64 arithmetic wraps around
        for v in (2**62, -(2**62) - 1, 2**63 - 1, -(2**63)):
            assert sess.run(None, {"n": np.array(v, dtype=np.int64)})[0] == 0, v


MODEL = """<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 300] x, int64[batch, 300] k) => (float[batch, 300] y, int64[batch, 300] j, bool[batch, 300] p) <float[300] w = {W}> {
    a = Mul(x, w)
    b = Relu(a)
    c = Add(b, x)
    y = Mul(c, x)
    j = Add(k, k)
    zero = Constant <value = float {0.0}> ()
    p = Greater(x, zero)
}"""


def _model():
    return model_from_text(
        MODEL.replace("{W}", "{" + ", ".join(str(v) for v in np.linspace(-2, 2, 300)) + "}")
    )


def test_outputs_are_untouched_bit_for_bit(key):
    model = _model()
    x = np.random.default_rng(0).standard_normal((2, 300)).astype(np.float32)
    x[0, :6] = [-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-45]
    x[1, 0] = np.nan  # the element a decoy may read
    feeds = {"x": x, "k": np.arange(600, dtype=np.int64).reshape(2, 300)}
    want = session(model, optimize="disabled").run(None, feeds)
    result = protect(model, key=key, obfuscate=True, ratio=1.0, seed=0, verify=False)
    assert result.decoys >= 3  # decoys and the three outputs' final nodes
    got = session(open_package(result.data, key)).run(None, feeds)
    for a, b in zip(want, got):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_ratio_zero_adds_nothing_and_one_reaches_every_node(key):
    none = protect(_model(), key=key, obfuscate=True, ratio=0.0, verify=False)
    assert none.decoys == 0
    full = protect(_model(), key=key, obfuscate=True, ratio=1.0, verify=False)
    assert full.decoys == full.groups + 3  # a decoy per anonymous node, a final node per output


def test_decoys_read_tensors_the_real_computation_does_not(key):
    """Every decoy has an edge from a value its site does not read: the visible dependencies are
    not the real ones."""
    model = _model()
    protected = protect(
        model, key=key, obfuscate=True, ratio=1.0, seed=1, verify=False, encrypt=False
    )
    import onnx

    obf = onnx.ModelProto.FromString(protected.data)
    consumers = {}
    for node in obf.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    chained = [
        n
        for n in obf.graph.node
        if len(n.output) == 1 and any(len(c.output) > 1 for c in consumers.get(n.output[0], []))
    ]
    assert chained, "no decoy feeds a protected node"
