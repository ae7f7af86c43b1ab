"""Weight perturbation: S - R gives the weight back bit for bit (numpy and the ONNX form agree,
for every dtype covered, with negative zeros, infinities, NaNs, subnormals and tiny values), and
S correlates with no original weight of its size."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from modelpress.protect import weights
from modelpress.protect.correlation import correlation, standardized
from modelpress.runtime.ort import session


def _awkward_float32(rng, n=3000) -> np.ndarray:
    w = (rng.standard_normal(n) * 0.05).astype(np.float32)
    w[:8] = [
        -0.0,
        0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-42,
        -3e-39,
        1e-30,
    ]  # zeros, specials, subnormals, tiny
    w[8] = np.float32(np.finfo(np.float32).max) / 1e6
    return w.reshape(30, 100)


def _decode_with_ort(stored: np.ndarray, t: weights.Transform, opset: int = 17) -> np.ndarray:
    s_in = ir.Value(
        name="s",
        type=ir.TensorType(ir.DataType.from_numpy(stored.dtype)),
        shape=ir.Shape(stored.shape),
    )
    nodes, out = weights.decode_nodes(t, s_in, opset)
    if t.dtype == ir.DataType.BFLOAT16:  # ORT's Python API has no bfloat16 arrays: widen (exactly)
        nodes.append(ir.node("Cast", [out], attributes={"to": ir.DataType.FLOAT}))
        out = nodes[-1].outputs[0]
    out.name = "w"
    graph = ir.Graph([s_in], [out], nodes=nodes, opset_imports={"": opset})
    sess = session(ir.Model(graph, ir_version=8), optimize="disabled")
    return sess.run(None, {"s": stored})[0]


@pytest.mark.parametrize(
    "make",
    [
        _awkward_float32,
        lambda rng: (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float16),
        lambda rng: rng.standard_normal((40, 40)).astype(ml_dtypes.bfloat16),
        lambda rng: rng.integers(-128, 128, (128, 9), dtype=np.int8),
        lambda rng: rng.integers(0, 256, (1200,), dtype=np.uint8),
        lambda rng: rng.integers(-(2**31), 2**31, (1100,), dtype=np.int64).astype(np.int32),
    ],
    ids=["float32-awkward", "float16", "bfloat16", "int8", "uint8", "int32"],
)
def test_the_inverse_is_exact_in_numpy_and_in_onnx(make):
    rng = np.random.default_rng(0)
    w = make(rng)
    assert weights.supported(w)
    stored, t = weights.encode(w, rng=rng)
    assert stored.size == w.size and stored.ndim == 1 and stored.dtype == t.store_dtype
    back = weights.decode(stored, t)
    assert back.dtype == w.dtype and back.shape == w.shape
    assert back.tobytes() == w.tobytes()  # bit for bit: -0.0, NaN payloads, subnormals
    want = w.astype(np.float32) if w.dtype == ml_dtypes.bfloat16 else w
    assert _decode_with_ort(stored, t).tobytes() == want.tobytes()
    # the transform survives its serialisation into the library
    t2 = weights.Transform.from_json(t.to_json())
    assert weights.decode(stored, t2).tobytes() == w.tobytes()


def test_noise_hides_the_values_and_the_layout():
    rng = np.random.default_rng(1)
    w = np.outer(np.linspace(-1, 1, 64), np.ones(64)).astype(np.float32)  # strong row structure
    stored, t = weights.encode(w, rng=rng)
    assert correlation(stored, w) < weights.TARGET_CORRELATION + 1e-9
    noise = stored - weights.decode(stored, t).reshape(-1)[np.argsort(weights.inverse_index(t))]
    assert np.abs(noise).std() > 50 * np.abs(w).std()  # the noise dominates every value


def test_no_correlation_with_any_target_of_the_same_size():
    rng = np.random.default_rng(2)
    targets = [(rng.standard_normal(1500) * s).astype(np.float32) for s in (0.02, 0.1, 1.0)]
    X = standardized(targets)
    for w in targets:
        stored, _ = weights.encode(w, rng=rng, targets=X)
        assert max(correlation(stored, x) for x in targets) <= weights.TARGET_CORRELATION + 1e-9


def test_a_wrong_transform_does_not_give_the_weight_back():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(100_000) * 0.1).astype(np.float32)  # chance correlation ~0.003
    stored, t = weights.encode(w, rng=rng)
    _, other = weights.encode(w, rng=rng)  # same weight, a fresh seed and mapping
    wrong = weights.decode(stored, other)
    assert correlation(wrong, w) < 0.05


def test_small_and_unsupported_tensors_stay_out():
    assert not weights.supported(np.zeros(weights.MIN_ELEMENTS - 1, np.float32))
    assert not weights.supported(np.zeros(1000, np.float64))  # no wider type to hold the noise
    assert not weights.supported(np.zeros(1000, np.int64))
    assert not weights.supported(np.zeros(1000, bool))
