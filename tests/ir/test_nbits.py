"""The block-quantized weight format against ONNX Runtime's kernels (optimizations off)."""

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from modelpress.errors import OptionError
from modelpress.ir import model_bytes, nbits

RNG = np.random.default_rng(0)


def _blocks(n, k, bits, bs, zp_kind):
    nb = -(-k // bs)
    codes = RNG.integers(0, 2**bits, size=(n, k)).astype(np.uint8)
    scales = (RNG.random((n, nb)) + 0.1).astype(np.float32)
    zp = {
        "none": None,
        "int": RNG.integers(0, 2**bits, size=(n, nb)).astype(np.uint8),
        "float": (RNG.random((n, nb)) * (2**bits - 1)).astype(np.float32),
    }[zp_kind]
    return nbits.Blocks(codes, scales, zp, bits, bs)


def _graph_model(build, k, in_type=ir.DataType.FLOAT, shape=(3, None)):
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 21, "com.microsoft": 1}, name="g")
    x = ir.Value(name="x", type=ir.TensorType(in_type), shape=ir.Shape(shape))
    graph.inputs.append(x)
    nodes, y = build(graph, x)
    graph.extend(nodes)
    y.name = "y"
    graph.outputs.append(y)
    return ir.Model(graph, ir_version=10)


def _run(model, feed):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model_bytes(model), so, providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


@pytest.mark.parametrize("k,bs", [(64, 32), (96, 64), (100, 32), (256, 128)])
@pytest.mark.parametrize(
    "bits,zp_kind",
    [(4, "none"), (4, "int"), (4, "float"), (8, "none"), (8, "int"), (8, "float")],
)
def test_matmul_nbits_and_standard_equal_numpy(k, bs, bits, zp_kind):
    b = _blocks(12, k, bits, bs, zp_kind)
    w = b.dequantize()
    a = RNG.standard_normal((3, k)).astype(np.float32)
    ref = a.astype(np.float64) @ w
    # float32 sums: an error of a few ulps of the summed terms' size; with float zero points the
    # terms are x·(q·s) and x·(z·s), which cancel down to x·w (up to 255·s each at 8 bits)
    size = np.abs(a) @ (np.abs(w) + np.abs(_offsets(b)))
    for build in (nbits.matmul_nbits, nbits.dq_matmul):
        m = _graph_model(lambda g, x, build=build: build(g, x, b, name="mm"), k)
        got = _run(m, {"x": a})
        assert np.all(np.abs(got - ref) <= 1e-5 * np.abs(ref) + 4e-7 * size), build.__name__


def _offsets(b):
    """``[K, N]``: each element's block offset ``z·s`` (0 without float zero points)."""
    if not b.float_zero_points:
        return np.zeros((b.k, b.n))
    per_block = (b.zero_points * b.scales).T  # [n_blocks, N]
    return np.repeat(per_block, b.block_size, axis=0)[: b.k]


@pytest.mark.parametrize("standard", [False, True])
def test_float_zero_points_use_the_integer_kernel(standard):
    """Float zero points never reach a kernel's zero-point input (ONNX Runtime's slow path):
    integer codes at zero point 0, plus the blocks' offsets through two small MatMuls; a rank-3
    activation (a decoder's [batch, sequence, K]) gives the reference too."""
    b = _blocks(40, 96, 4, 32, "float")
    build = nbits.dq_matmul if standard else nbits.matmul_nbits
    m = _graph_model(lambda g, x: build(g, x, b, name="mm"), 96, shape=(2, None, 96))
    for node in m.graph:
        for v in node.inputs:
            if v is not None and v.const_value is not None and "zero_points" in v.name:
                assert v.const_value.numpy().dtype != np.float32
    assert sorted(n.op_type for n in m.graph).count("MatMul") == 2 + standard
    a = RNG.standard_normal((2, 5, 96)).astype(np.float32)
    np.testing.assert_allclose(
        _run(m, {"x": a}), a.astype(np.float64) @ b.dequantize(), rtol=1e-5, atol=1e-4
    )


def test_dequantize_formula():
    b = _blocks(2, 64, 4, 32, "int")
    w = b.dequantize()
    n, blk = 1, 1
    q = b.codes[n, 32:64].astype(np.float32)
    np.testing.assert_array_equal(w[32:64, n], (q - b.zero_points[n, blk]) * b.scales[n, blk])
    sym = nbits.Blocks(b.codes, b.scales, None, 4, 32)
    np.testing.assert_array_equal(
        sym.dequantize()[:32, 0], (b.codes[0, :32] - np.float32(8)) * b.scales[0, 0]
    )


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [64, 100, 33])
def test_pack_round_trips(bits, k):
    b = _blocks(5, k, bits, 32, "int")
    packed = nbits.pack_codes(b.codes, bits, 32)
    assert packed.shape == (5, -(-k // 32), 32 * bits // 8)
    np.testing.assert_array_equal(nbits.unpack_codes(packed, bits, k), b.codes)
    zp = nbits.pack_zero_points(b.zero_points, bits)
    back = nbits.unpack_zero_points(zp, bits, 5, b.n_blocks)
    np.testing.assert_array_equal(back, b.zero_points)
    if bits == 4:
        assert packed[0, 0, 0] == b.codes[0, 0] | (b.codes[0, 1] << 4)  # even element low


@pytest.mark.parametrize("bits,zp_kind", [(4, "none"), (4, "int"), (8, "none"), (8, "int")])
@pytest.mark.parametrize("standard", [False, True])
def test_gather_block_quantized(bits, zp_kind, standard):
    b = _blocks(20, 64, bits, 32, zp_kind)  # a table [V=20, D=64]
    table = b.dequantize().T
    ids = np.array([[0, 5, 19], [3, 3, 7]], np.int64)
    m = _graph_model(
        lambda g, x: nbits.gather_block_quantized(g, x, b, name="emb", standard=standard),
        64,
        ir.DataType.INT64,
        (2, 3),
    )
    np.testing.assert_array_equal(_run(m, {"x": ids}), table[ids])


def test_refusals():
    b = _blocks(4, 64, 8, 32, "float")
    g = ir.Graph([], [], nodes=[], opset_imports={"": 21})
    with pytest.raises(OptionError, match="integer zero points"):
        nbits.gather_block_quantized(g, ir.Value(name="x"), b, name="emb")
    with pytest.raises(OptionError, match="block_size"):
        nbits.Blocks(b.codes, b.scales, None, 4, 24)
    with pytest.raises(OptionError, match="bits"):
        nbits.Blocks(b.codes, b.scales, None, 3, 32)
