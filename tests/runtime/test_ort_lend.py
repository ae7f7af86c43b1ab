"""``runtime.ort.session`` lends a big model's initializers to ONNX Runtime instead of
serializing them: the session computes the same outputs, the model is left as it was, and an
initializer that is also an input (overridable) stays in the bytes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from modelpress.ir import from_proto
from modelpress.runtime import ort as mp_ort


def _model():
    import onnx
    from onnx import numpy_helper

    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 512] x) => (float[2, 512] y) {
        h = MatMul (x, w)
        y = Add (h, b)
    }
    """)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    proto.graph.initializer.extend(
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    )
    return from_proto(proto)


@pytest.mark.parametrize("overridable", [False, True])
def test_lent_initializers_compute_the_same(monkeypatch, overridable):
    model = _model()
    if overridable:
        b = model.graph.initializers["b"]
        model.graph.inputs.append(b)
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    want = mp_ort.session(model).run(None, {"x": x})[0]
    monkeypatch.setattr(mp_ort, "LEND_BYTES", 1)
    monkeypatch.setattr(mp_ort, "_LEND_MIN", 1)
    sess = mp_ort.session(model)
    lent = sess._modelpress_lent
    assert len(lent[0]) == (1 if overridable else 2)  # an overridable initializer is not lent
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    assert not isinstance(model.graph.initializers["w"].const_value, ir.ExternalTensor)  # back
