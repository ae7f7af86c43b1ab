"""Weight mixing (``mixing.py`` on the groups of ``channels.py``): every layer computes what it did
once the run-time values are given (ONNX Runtime with its optimizations off and on, tight
tolerance: only the order of a layer's sums changes); the hidden channel orders travel through
BatchNorm, ReLU, residual Adds, depthwise convolutions, pooling, Flatten and LayerNorm with no
operator between the layers, and are undone only at the graph's outputs (or where an operator
does not treat channels alike); the stored weights are deranged and correlate with the originals
only by chance; the run-time values come back from their spec alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from modelpress.ir import from_proto, model_bytes
from modelpress.ir.shapes import ensure_types
from modelpress.protect import channels, mixing
from modelpress.protect.correlation import correlation

RTOL, ATOL = 1e-5, 1e-6

LAYERS = """
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

# a residual CNN: stem, a block with a residual Add, a depthwise conv, pooling, a classifier
CNN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3, 8, 8] x) => (float[2, 10] y) {
    a = Conv <pads = [1, 1, 1, 1]> (x, w0, b0)
    an = BatchNormalization (a, s0, o0, m0, v0)
    ar = Relu (an)
    b = Conv <pads = [1, 1, 1, 1]> (ar, w1)
    bn = BatchNormalization (b, s1, o1, m1, v1)
    br = Relu (bn)
    p = Pad (br, pads)
    c = Conv (p, w2, b2)
    r = Add (c, ar)
    cr = Clip (r, lo, hi)
    dw = Conv <group = 32, pads = [1, 1, 1, 1]> (cr, w3)
    ds = Mul (dw, cr)
    pool = GlobalAveragePool (ds)
    f = Flatten (pool)
    y = Gemm <transB = 1> (f, wf, bf)
}
"""

# a transformer's feed-forward block with its residual and LayerNorm
FFN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 5, 64] x) => (float[2, 5, 64] y) {
    x2 = MatMul (x, w0)
    h = MatMul (x, w1)
    hb = Add (h, b1)
    g1 = Div (hb, sqrt2)
    g2 = Erf (g1)
    g3 = Add (g2, one)
    g4 = Mul (hb, g3)
    o = MatMul (g4, w2)
    ob = Add (o, b2)
    r = Add (ob, x2)
    y = LayerNormalization <axis = -1> (r, gamma, beta)
}
"""


def _with(text: str, arrays: dict[str, np.ndarray]) -> ir.Model:
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    onnx.checker.check_model(proto)
    model = from_proto(proto)
    ensure_types(model)
    return model


def _random(shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _layers() -> ir.Model:
    arrays = _random(
        {
            "wc": (128, 16, 3, 3),
            "bc": (128,),
            "wg": (128, 64, 1, 1),
            "wm": (128, 256),
            "table": (200, 128),
            "wh": (160, 128),
            "bh": (160,),
        }
    )
    arrays["shape"] = np.array([-1, 128], np.int64)
    return _with(LAYERS, arrays)


def _cnn() -> ir.Model:
    arrays = _random(
        {
            "w0": (32, 3, 3, 3),
            "b0": (32,),
            "w1": (32, 32, 3, 3),
            "w2": (32, 32, 3, 3),
            "b2": (32,),
            "w3": (32, 1, 3, 3),
            "wf": (10, 32),
            "bf": (10,),
            **{f"{k}{i}": (32,) for k in "so" for i in (0, 1)},
        }
    )
    for i in (0, 1):
        arrays[f"m{i}"] = np.random.default_rng(i).standard_normal(32).astype(np.float32)
        arrays[f"v{i}"] = np.random.default_rng(i).uniform(0.5, 2, 32).astype(np.float32)
    arrays["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    arrays["lo"], arrays["hi"] = np.array(0, np.float32), np.array(6, np.float32)
    return _with(CNN, arrays)


def _ffn() -> ir.Model:
    arrays = _random(
        {
            "w0": (64, 64),
            "w1": (64, 256),
            "b1": (256,),
            "w2": (256, 64),
            "b2": (64,),
            "gamma": (64,),
            "beta": (64,),
        }
    )
    arrays["sqrt2"], arrays["one"] = np.array(1.4142135, np.float32), np.array(1, np.float32)
    return _with(FFN, arrays)


FEEDS = {
    "layers": lambda rng: {
        "x": rng.standard_normal((2, 16, 6, 6)).astype(np.float32),
        "t": rng.standard_normal((2, 3, 128)).astype(np.float32),
        "ids": rng.integers(-200, 200, (2, 3)).astype(np.int64),
    },
    "cnn": lambda rng: {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)},
    "ffn": lambda rng: {"x": rng.standard_normal((2, 5, 64)).astype(np.float32)},
}
BUILD = {"layers": _layers, "cnn": _cnn, "ffn": _ffn}


def _mixed(model: ir.Model):
    specs: dict[str, dict] = {}
    names = iter(f"n{i}" for i in range(1000))

    def secret(spec, dtype, rank):
        value = ir.Value(name=next(names), type=ir.TensorType(dtype), shape=ir.Shape([None] * rank))
        model.graph.inputs.append(value)
        specs[value.name] = spec
        return value

    before = set(model.graph)
    done = mixing.mix(
        model.graph, rng=np.random.default_rng(2), secret=secret, new_name=lambda: next(names)
    )
    return done, specs, [n for n in model.graph if n not in before]


def _run(model: ir.Model, feeds: dict, optimized: bool) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model_bytes(model), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("name, layers", [("layers", 4), ("cnn", 7), ("ffn", 6)])
def test_every_mixed_model_computes_what_it_did(name, layers):
    model = BUILD[name]()
    done, specs, _ = _mixed(model)
    assert done == layers
    feeds = FEEDS[name](np.random.default_rng(1))
    want = _run(BUILD[name](), feeds, optimized=False)
    given = {**feeds, **{n: mixing.values(spec) for n, spec in specs.items()}}
    for optimized in (False, True):
        for w, g in zip(want, _run(model, given, optimized)):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * float(np.abs(w).max()))


@pytest.mark.parametrize("name", ["cnn", "ffn"])
def test_no_operator_between_layers_only_at_the_outputs(name):
    model = BUILD[name]()
    _, specs, added = _mixed(model)
    assert Counter(n.op_type for n in added) == Counter({"Gather": 1})
    (gather,) = added
    assert gather.outputs[0].is_graph_output()  # the one inverse sits at the output
    assert len(specs) == 1  # and is the one value the runtime supplies


def test_the_groups_follow_the_residual_and_the_depthwise_conv():
    found = channels.plan(_cnn().graph)
    # the stem, the residual branch, its Add, the Clip, the depthwise conv and the Mul share one
    # order; the first block's conv has its own; the classifier's is undone at the output
    assert sorted(found.sizes.values()) == [10, 32, 32]
    (boundary,) = found.boundaries
    assert boundary.output and not boundary.users


def test_the_stored_weights_are_deranged_and_uncorrelated():
    model = _layers()
    before = {n: v.const_value.numpy().copy() for n, v in model.graph.initializers.items()}
    _mixed(model)
    stored = [
        v.const_value.numpy()
        for n, v in model.graph.initializers.items()
        if n not in before and v.const_value.size >= mixing.MIN_ELEMENTS
    ]
    assert len(stored) == 4
    for s in stored:
        for w in [w for w in before.values() if w.size == s.size]:
            assert correlation(s, w) < 4 / np.sqrt(s.size)  # chance: 4 standard deviations
            assert correlation(np.abs(s), np.abs(w)) < 0.5  # nothing left in place


def test_what_the_rule_does_not_cover_is_left_alone():
    rng = np.random.default_rng(0)
    model = _with(
        """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 4, 4] x, float[1, 128] t, float[128, 128] u) => (float[1, 8, 4, 4] y,
                                                                  float[1, 128] b) {
        y = Conv <group = 8> (x, dw)
        b = MatMul (t, u)
    }
    """,
        {"dw": rng.standard_normal((8, 1, 3, 3)).astype(np.float32)},
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


def test_the_protected_cnn_has_nothing_between_its_convolutions(zoo_paths):
    """resnet-digits protected end to end, opened and inlined as ONNX Runtime inlines it: no
    Gather or Mul (the old per-layer inverse) feeds a convolution, directly or through others."""
    import onnx.inliner

    from modelpress.ir import to_proto
    from modelpress.protect import open_package, protect

    key = bytes(range(32))
    result = protect(zoo_paths["resnet-digits"], key=key, obfuscate=True, ratio=0.6, seed=3)
    graph = onnx.inliner.inline_local_functions(to_proto(open_package(result.data, key))).graph
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert len(convs) >= 9
    for node in graph.node:
        if node.op_type not in ("Gather", "Mul"):
            continue
        seen, todo = set(), list(node.output)
        while todo:
            for reader in readers.get(todo.pop(), []):
                assert reader.op_type != "Conv", f"a {node.op_type} feeds a convolution"
                if id(reader) not in seen:
                    seen.add(id(reader))
                    todo += list(reader.output)
