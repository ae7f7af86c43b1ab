"""GGUF's Q4_0/Q4_1/Q8_0 blocks read as ``Blocks`` equal the gguf package's own dequantization."""

import numpy as np
import pytest

from modelpress.compress.llm.gguf_import import _unpermute_order, gguf_blocks

gguf = pytest.importorskip("gguf")
RNG = np.random.default_rng(0)
SIZES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _raw(kind, n, k, zero_d=False):
    nb = k // 32
    raw = RNG.integers(0, 256, size=(n, nb, SIZES[kind]), dtype=np.uint8)
    d = (RNG.random((n, nb)) * 0.1 + 0.01).astype(np.float16)
    if zero_d:
        d[0, 0] = 0
    raw[..., 0:2] = d[..., None].view(np.uint8).reshape(n, nb, 2)
    if kind == "Q4_1":
        m = (RNG.standard_normal((n, nb)) * 0.1).astype(np.float16)
        raw[..., 2:4] = m[..., None].view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_equal_gguf_dequantize(kind):
    n, k = 6, 96
    raw = _raw(kind, n, k, zero_d=kind == "Q4_1")
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(n, k)
    b = gguf_blocks(raw, kind, k)
    assert b.bits == (8 if kind == "Q8_0" else 4) and b.float_zero_points == (kind == "Q4_1")
    np.testing.assert_allclose(b.dequantize().T, ref, rtol=1e-5, atol=1e-6)


def test_other_types_are_not_blocks():
    assert gguf_blocks(np.zeros((2, 8), np.uint8), "Q6_K", 256) is None


def test_unpermute_undoes_llama_cpp_rope_permutation():
    heads, n = 3, 12
    hf = np.arange(n * 4).reshape(n, 4)
    # llama.cpp's convert_hf_to_gguf permute
    permuted = hf.reshape(heads, 2, n // heads // 2, 4).swapaxes(1, 2).reshape(n, 4)
    np.testing.assert_array_equal(permuted[_unpermute_order(n, heads)], hf)
