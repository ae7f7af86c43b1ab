"""int8 weights that CPUs whose kernels sum in int16 pairs still multiply exactly.

x86 CPUs without VNNI (see ``runtime.cpu``) add the products of two neighbouring reduction
elements in int16 with saturation before summing in int32. A uint8 activation code reaches 255,
so one output channel's weight codes ``q`` are safe when, for every pair the kernel forms,
``|q[2i] + q[2i+1]| ≤ 128`` (``255 · 128 = 32640 ≤ 32767``; a pair of opposite signs cannot
saturate, since each product alone fits). The pairs follow the order in which ONNX Runtime's kernel
reads the reduction: ``K`` for MatMul and Gemm, ``(kh, kw, C/group)`` for a Conv (it reorders the
filter to NHWC), pairs starting at even positions. Depthwise Convs run on a kernel of their own that
sums exactly, and are left alone.

The scale: per output channel, ``max(max|w|, max |w[2i] + w[2i+1]|) / 127``. Rounding each code to
nearest then meets the rule (two roundings add at most 1 to a sum of at most 127); codes chosen
another way (GPTQ) are brought within it by ``limit``. Where no pair of a channel's weights comes
near the limit, the scale is the plain 8-bit one, so most layers lose nothing; at worst a channel
loses one bit (the 7-bit weights ONNX Runtime's own quantizer offers as ``reduce_range``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.layers import output_channel_axis
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerTensor,
    QParams,
    qparams_from_range,
    quantize,
)
from modelpress.compress.quantize.qparams import (
    weight_qparams as plain_qparams,
)

# Largest magnitude of a pair sum of codes whose products with 255 fit int16.
PAIR_LIMIT = 128


def applies(node: ir.Node, w: np.ndarray) -> bool:
    """Whether ``node``'s weight goes through the pairwise kernel (not a depthwise Conv)."""
    return not (
        node.op_type == "Conv" and node.attributes.get_int("group", 1) > 1 and w.shape[1] == 1
    )


def kernel_rows(node: ir.Node, w: np.ndarray) -> np.ndarray:
    """``w`` as ``[output channels, reduction]`` in the order the kernel reads it."""
    if node.op_type == "Conv":
        return w.transpose(0, *range(2, w.ndim), 1).reshape(w.shape[0], -1)
    return w if output_channel_axis(node) == 0 else w.T


def from_kernel_rows(node: ir.Node, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of ``kernel_rows``."""
    if node.op_type == "Conv":
        nhwc = rows.reshape(shape[0], *shape[2:], shape[1])
        return nhwc.transpose(0, nhwc.ndim - 1, *range(1, nhwc.ndim - 1))
    return rows if output_channel_axis(node) == 0 else rows.T


def _pair_sums(rows: np.ndarray) -> np.ndarray:
    """``rows[:, 2i] + rows[:, 2i+1]`` (an odd last element pairs with the kernel's zero pad)."""
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), rows.dtype)], axis=1)
    return rows[:, 0::2] + rows[:, 1::2]


def weight_qparams(node: ir.Node, w: np.ndarray, *, per_channel: bool) -> QParams:
    """Symmetric int8 QParams for ``w`` whose round-to-nearest codes meet the pair rule."""
    return rows_qparams(
        kernel_rows(node, w), axis=output_channel_axis(node), per_channel=per_channel
    )


def rows_qparams(rows: np.ndarray, *, axis: int, per_channel: bool) -> QParams:
    """The same, for a weight given as its kernel rows ``[output channels, reduction]`` whose
    output channels lie along ``axis`` of the stored weight."""
    rows = rows.astype(np.float64)
    amax = np.maximum(np.abs(rows).max(axis=1), np.abs(_pair_sums(rows)).max(axis=1))
    if not per_channel:
        return qparams_from_range(-amax.max(), amax.max(), dtype="int8", symmetric=True)
    return qparams_from_range(-amax, amax, dtype="int8", symmetric=True, axis=axis)


def worst_pair(node: ir.Node, codes: np.ndarray) -> int:
    """The largest ``|q[2i] + q[2i+1]|`` of ``codes`` (0 when the weight is not paired)."""
    if not applies(node, codes):
        return 0
    return int(np.abs(_pair_sums(kernel_rows(node, codes).astype(np.int32))).max(initial=0))


def limit(node: ir.Node, codes: np.ndarray) -> np.ndarray:
    """``codes`` with every pair over the limit brought back to it, by taking the excess off the
    larger of the two codes (the smaller relative change)."""
    if not applies(node, codes) or worst_pair(node, codes) <= PAIR_LIMIT:
        return codes
    rows = kernel_rows(node, codes).astype(np.int32)
    odd = rows.shape[1] % 2
    if odd:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), np.int32)], axis=1)
    a, b = rows[:, 0::2], rows[:, 1::2]
    s = a + b
    excess = np.maximum(np.abs(s) - PAIR_LIMIT, 0) * np.sign(s)
    take_a = np.abs(a) >= np.abs(b)
    a = np.where(take_a, a - excess, a)
    b = np.where(take_a, b, b - excess)
    rows[:, 0::2], rows[:, 1::2] = a, b
    if odd:
        rows = rows[:, :-1]
    return from_kernel_rows(node, rows.astype(codes.dtype), codes.shape)


def round_weight(
    node: ir.Node, w: np.ndarray, *, per_channel: bool, dtype: str = "int8", pair_safe: bool = False
) -> tuple[np.ndarray, QParams]:
    """A weight's codes rounded to nearest and their QParams: symmetric, per output channel or per
    tensor, and pair-safe when asked (and the kernel pairs the weight). Every mode that rounds an
    int8 weight of a Conv, Gemm or MatMul to nearest goes through here, so the bias correction
    sees the codes the graph will hold."""
    if pair_safe and dtype == "int8" and applies(node, w):
        qp = weight_qparams(node, w, per_channel=per_channel)
        return limit(node, quantize(w, qp)), qp
    gran = PerChannel(output_channel_axis(node)) if per_channel else PerTensor()
    qp = plain_qparams(w, gran, dtype=dtype, symmetric=True)
    return quantize(w, qp), qp
