"""int8 weights for CPUs whose kernels sum u8·s8 products in saturating int16 pairs.

An emulator of that arithmetic (``saturating_matmul``: products of neighbouring reduction elements
added in int16 with saturation, in the order ONNX Runtime's kernel reads the reduction) checks the
formats on any machine, whatever its own kernels do.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from quant_models import image_like, mlp, small_cnn, thin_stem_cnn

from modelpress.compress import quantize
from modelpress.compress.quantize import pairs
from modelpress.ir.match import const_array
from modelpress.runtime.cpu import TARGET_METADATA_KEY


def saturating_matmul(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a [M, K]`` (uint8 codes) times ``rows [N, K]`` (int8 codes) the way vpmaddubsw sums."""
    k = a.shape[1]
    if k % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        rows = np.pad(rows, ((0, 0), (0, 1)))
    prod = a[:, None, :].astype(np.int32) * rows[None, :, :].astype(np.int32)
    pair = np.clip(prod[..., 0::2] + prod[..., 1::2], -32768, 32767)
    return pair.sum(axis=-1)


def exact_matmul(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ rows.astype(np.int64).T


def _conv(shape, group=1) -> ir.Node:
    w = ir.Value(name="w", const_value=ir.tensor(np.zeros(shape, np.float32)))
    return ir.node("Conv", [ir.Value(name="x"), w], attributes={"group": group})


def _weights(model: ir.Model) -> dict[str, tuple[ir.Node, np.ndarray]]:
    """Each weighted node's int8 weight codes, read through its DequantizeLinear."""
    out = {}
    for node in model.graph:
        if node.op_type not in ("Conv", "MatMul", "Gemm", "MatMulInteger"):
            continue
        w = node.inputs[1]
        dq = w.producer()
        codes = (
            const_array(dq.inputs[0])
            if dq is not None and dq.op_type == "DequantizeLinear"
            else const_array(w)
        )
        if codes is not None and codes.dtype == np.int8:
            out[node.name] = (node, codes)
    return out


@pytest.mark.parametrize(
    ("op", "shape", "attrs"),
    [
        ("Conv", (8, 3, 3, 3), {}),
        ("Conv", (8, 2, 3, 3), {"group": 2}),
        ("MatMul", (12, 5), {}),
        ("Gemm", (5, 12), {"transB": 1}),
    ],
)
def test_kernel_rows_round_trip_and_order(op, shape, attrs, rng):
    w = rng.standard_normal(shape).astype(np.float32)
    node = ir.node(op, [ir.Value(name="x"), ir.Value(name="w")], attributes=attrs)
    rows = pairs.kernel_rows(node, w)
    assert np.array_equal(pairs.from_kernel_rows(node, rows, w.shape), w)
    if op == "Conv":  # NHWC order: channels of one kernel position are neighbours
        assert rows[0, 1] == w[0, 1, 0, 0] and rows[0, shape[1]] == w[0, 0, 0, 1]
    else:  # one row per output feature, the reduction along it
        assert rows.shape == (5, 12)


def test_the_emulator_saturates_where_the_plain_format_overflows_and_not_on_pair_safe_codes(rng):
    node = _conv((16, 1, 3, 3))
    w = (rng.standard_normal((16, 1, 3, 3)) * 0.5).astype(np.float32)
    a = np.full((4, 9), 255, np.uint8)  # the worst case: every input code at the top
    a[1:] = rng.integers(0, 256, (3, 9))
    plain, _ = pairs.round_weight(node, w, per_channel=True)
    safe, _ = pairs.round_weight(node, w, per_channel=True, pair_safe=True)
    plain_rows, safe_rows = pairs.kernel_rows(node, plain), pairs.kernel_rows(node, safe)
    assert pairs.worst_pair(node, plain) > pairs.PAIR_LIMIT  # a 1-channel stem's 8-bit codes
    assert not np.array_equal(saturating_matmul(a, plain_rows), exact_matmul(a, plain_rows))
    assert pairs.worst_pair(node, safe) <= pairs.PAIR_LIMIT
    assert np.array_equal(saturating_matmul(a, safe_rows), exact_matmul(a, safe_rows))


def test_pair_scale_is_the_plain_scale_where_no_pair_comes_near_the_limit(rng):
    node = ir.node("MatMul", [ir.Value(name="x"), ir.Value(name="w")])
    w = rng.standard_normal((64, 8)).astype(np.float32)
    w[1::2] = -np.abs(w[0::2]) * np.sign(w[0::2]) * 0.9  # every pair has opposite signs
    _, plain = pairs.round_weight(node, w, per_channel=True)
    _, safe = pairs.round_weight(node, w, per_channel=True, pair_safe=True)
    np.testing.assert_array_equal(safe.scale, plain.scale)
    # same-sign neighbours: the scale grows to fit the pair, by at most 2x (7-bit at worst)
    w2 = np.abs(w)
    _, plain2 = pairs.round_weight(node, w2, per_channel=True)
    _, safe2 = pairs.round_weight(node, w2, per_channel=True, pair_safe=True)
    ratio = safe2.scale / plain2.scale
    assert (ratio >= 1).all() and (ratio <= 2 + 1e-6).all() and (ratio > 1).any()


def test_limit_brings_any_codes_within_the_limit_with_the_least_change(rng):
    node = _conv((4, 6, 3, 3))
    codes = rng.integers(-127, 128, (4, 6, 3, 3)).astype(np.int8)
    fixed = pairs.limit(node, codes)
    assert pairs.worst_pair(node, fixed) <= pairs.PAIR_LIMIT
    rows, fixed_rows = (
        pairs.kernel_rows(node, codes).astype(int),
        pairs.kernel_rows(node, fixed).astype(int),
    )
    a, b = rows[:, 0::2], rows[:, 1::2]
    excess = np.maximum(np.abs(a + b) - pairs.PAIR_LIMIT, 0)
    assert np.abs(fixed_rows - rows).sum() == excess.sum()  # exactly the excess is taken off
    untouched = np.repeat(excess == 0, 2, axis=1)
    assert np.array_equal(fixed_rows[untouched], rows[untouched])


def test_depthwise_weights_are_not_paired(rng):
    node = _conv((8, 1, 3, 3), group=8)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    assert not pairs.applies(node, w)
    plain, qp = pairs.round_weight(node, w, per_channel=True)
    safe, qps = pairs.round_weight(node, w, per_channel=True, pair_safe=True)
    assert np.array_equal(plain, safe) and qp == qps


@pytest.mark.parametrize("gptq", [True, False])
def test_static_int8_for_avx2_keeps_every_paired_weight_exact_and_says_so(gptq, rng):
    model = thin_stem_cnn(residual=True)  # its 1-channel stem reads full-range codes
    calib = [{"x": image_like(rng, (8, 1, 8, 8))} for _ in range(4)]
    safe = quantize(model, mode="static", data=calib, target_cpu="avx2", gptq=gptq)
    plain = quantize(model, mode="static", data=calib, target_cpu="vnni", gptq=gptq)
    assert safe.target == "avx2" and safe.model.metadata_props[TARGET_METADATA_KEY] == "avx2"
    assert plain.model.metadata_props[TARGET_METADATA_KEY] == "vnni"
    weights = _weights(safe.model)
    assert "stem" in weights and len(weights) >= 3
    assert all(pairs.worst_pair(n, c) <= pairs.PAIR_LIMIT for n, c in weights.values())
    assert pairs.worst_pair(*_weights(plain.model)["stem"]) > pairs.PAIR_LIMIT
    from modelpress.compress.quantize.check import saturating_layers

    assert saturating_layers(safe.model) == [] and "stem" in saturating_layers(plain.model)
    # the cost: the reference arithmetic of the safe model stays close to the plain one's
    assert safe.check.reference_error < max(2.5 * plain.check.reference_error, 0.02)


def test_dynamic_int8_for_avx2_keeps_matmulinteger_weights_exact(rng):
    model = mlp()
    safe = quantize(model, mode="dynamic", target_cpu="portable")
    weights = _weights(safe.model)
    assert weights and safe.model.metadata_props[TARGET_METADATA_KEY] == "portable"
    for node, codes in weights.values():  # MatMulInteger reduces over the rows of W [K, N]
        sums = codes[0::2].astype(int) + np.pad(codes, ((0, codes.shape[0] % 2), (0, 0)))[1::2]
        assert np.abs(sums).max() <= pairs.PAIR_LIMIT, node.name


def test_weight_only_and_float16_carry_no_target(rng):
    for mode in ("weight-only", "fp16"):
        result = quantize(small_cnn(), mode=mode)
        assert result.target is None and TARGET_METADATA_KEY not in result.model.metadata_props


def test_an_unknown_target_is_refused():
    from modelpress.errors import OptionError

    with pytest.raises(OptionError, match="`target_cpu` 'sse4'"):
        quantize(mlp(), mode="dynamic", target_cpu="sse4")


def test_gptq_clips_the_second_of_each_pair_as_it_solves(rng):
    """On the plain 8-bit grid, where neighbouring codes of one sign overflow a pair, GPTQ with
    ``paired`` keeps every pair within the limit, and still moves the output less than the same
    pairs clipped after rounding to nearest."""
    from modelpress.compress.quantize.gptq import gptq, output_error
    from modelpress.compress.quantize.qparams import PerChannel, dequantize, weight_qparams

    x = rng.standard_normal((512, 64)) @ (np.eye(64) + 0.3 * rng.standard_normal((64, 64)))
    w = np.abs(rng.standard_normal((64, 16)))  # [K, N]: same-sign neighbours everywhere
    h = x.T @ x
    grid = weight_qparams(w.astype(np.float32), PerChannel(1), dtype="int8", symmetric=True)
    free, _ = gptq(w, h, grid=grid)
    paired, _ = gptq(w, h, grid=grid, paired=True)
    sums = lambda c: np.abs(c[0::2].astype(int) + c[1::2].astype(int)).max()  # noqa: E731
    assert sums(free) > pairs.PAIR_LIMIT and sums(paired) <= pairs.PAIR_LIMIT
    node = ir.node("MatMul", [ir.Value(name="x"), ir.Value(name="w")])
    clipped = pairs.limit(node, np.clip(np.rint(w / grid.scale), -127, 127).astype(np.int8))
    assert output_error(w, dequantize(paired, grid), h) < output_error(
        w, dequantize(clipped, grid), h
    )
