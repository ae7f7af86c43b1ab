"""Fold an inference-mode BatchNormalization into the Conv, ConvTranspose, Gemm or MatMul before it.

BatchNormalization in inference mode is a per-channel affine map ``y = s·x + t`` with
``s = scale / sqrt(var + eps)`` and ``t = B - mean·s``. When it follows a linear op whose weight is a
constant, the map folds into that weight and bias:

- ``Conv(x, W, b)``: ``W[m] *= s[m]``, ``b = b·s + t`` (W is (M, C/group, k...), so the output
  channel is W's first axis whatever the group count).
- ``ConvTranspose(x, W, b)``: W is (C_in, M/group, k...); output channel ``m = g·(M/group) + j``
  lives at ``W[g·C_in/group : (g+1)·C_in/group, j]``, so ``s`` is applied per group block.
- ``Gemm(A, B, C)``: the output is (N, M) and BatchNormalization's channel axis 1 is its column
  axis: B's output columns are scaled (rows when ``transB=1``), ``C = beta·C·s + t``, ``beta = 1``.
- ``MatMul(x, W)`` with a constant 2-D W and a rank-2 x (so that the channel axis 1 is the last
  axis, which W's columns index) becomes ``Gemm(x, W·s, t)``. For rank > 2 the channel axis is not
  W's axis and nothing can be folded.

Precondition (``check``): the BatchNormalization is in inference mode (``training_mode=0``, no extra
outputs, ``is_test=1`` before opset 7, ``spatial=1`` before opset 9) with constant scale, bias, mean
and variance; the linear op's weight (and bias, if any) is constant and floating point; and the
linear op's output has no other reader and is no graph output (otherwise the un-normalized value
would still be needed). The folding is done in float64 and cast back to the weight's dtype.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node, replace_value, replace_with_new
from modelpress.ir.match import (
    attr,
    const_array,
    graph_opset,
    known_rank,
    producer_of,
)
from modelpress.passes.rule import FusionPass, absorb_refusal


def bn_refusal(bn: ir.Node, opset: int) -> str | None:
    """Why ``bn`` is not an inference-mode BatchNormalization with constant parameters, or None."""
    if (
        bn.domain not in ("", "ai.onnx")
        or bn.op_type != "BatchNormalization"
        or len(bn.inputs) != 5
    ):
        return "not a BatchNormalization with its five inputs"
    # Extra outputs (running mean/var, saved statistics) exist only in training mode, where Y is
    # normalized with the batch's own statistics: nothing constant to fold.
    if len(bn.outputs) != 1 or attr(bn, "training_mode", 0) != 0:
        return "training mode: it normalizes with the batch's own statistics"
    if opset < 7 and attr(bn, "is_test", 0) != 1:
        return "training mode (is_test=0): it normalizes with the batch's own statistics"
    if (
        attr(bn, "spatial", 1) != 1
    ):  # spatial=0 (before opset 9) normalizes per element, not per channel
        return "spatial=0: it normalizes per element, not per channel"
    params = [const_array(v) for v in bn.inputs[1:]]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params):
        return "scale, bias, mean and variance are not all constant 1-D floats"
    if len({p.shape for p in params}) != 1:
        return "scale, bias, mean and variance differ in length"
    return None


def bn_affine(bn: ir.Node) -> tuple[np.ndarray, np.ndarray]:
    """``(s, t)`` in float64 for a BatchNormalization that ``bn_refusal`` accepts."""
    scale, bias, mean, var = (const_array(v).astype(np.float64) for v in bn.inputs[1:])
    eps = float(attr(bn, "epsilon", 1e-5))
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def channel_affine_refusal(conv: ir.Node, s: np.ndarray | None, t: np.ndarray | None) -> str | None:
    """Why ``fold_channel_affine(graph, conv, s, t)`` cannot fold into ``conv``, or None."""
    if conv.op_type not in ("Conv", "ConvTranspose") or len(conv.inputs) < 2:
        return "not a Conv or ConvTranspose with a weight"
    w = const_array(conv.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim < 3:
        return f"the {conv.op_type} weight is not a constant float tensor of rank >= 3"
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    b = const_array(conv.inputs[2]) if has_bias else None
    if has_bias and b is None:
        return f"the {conv.op_type} bias is not a constant"
    group = int(attr(conv, "group", 1))
    if conv.op_type == "Conv":
        m = w.shape[0]
    else:
        if group < 1 or w.shape[0] % group:
            return f"the ConvTranspose weight's {w.shape[0]} input channels do not split into {group} groups"
        m = w.shape[1] * group
    for v in (s, t):
        if v is not None and v.shape != (m,):
            return f"{v.shape[0]} channels to fold, the {conv.op_type} has {m}"
    if b is not None and b.shape != (m,):
        return f"the {conv.op_type} bias is shaped {b.shape}, not ({m},)"
    return None


def fold_channel_affine(
    graph: ir.Graph | ir.Function, conv: ir.Node, s: np.ndarray | None, t: np.ndarray | None
) -> None:
    """Rewrite ``conv`` (Conv or ConvTranspose, constant weight) so it also computes ``y·s + t``
    per output channel. ``s``/``t``: float64 arrays of length M, or None for 1 / 0. The caller
    has checked ``channel_affine_refusal``."""
    w = const_array(conv.inputs[1])
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    b = const_array(conv.inputs[2]) if has_bias else None
    group = int(attr(conv, "group", 1))
    m = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * group
    w64 = w.astype(np.float64)
    b64 = np.zeros(m) if b is None else b.astype(np.float64)
    if s is not None:
        if conv.op_type == "Conv":
            w64 = w64 * s.reshape((m,) + (1,) * (w.ndim - 1))
        else:
            cin, mg = w.shape[0], w.shape[1]
            blocks = w64.reshape((group, cin // group, mg) + w.shape[2:])
            w64 = (blocks * s.reshape((group, 1, mg) + (1,) * (w.ndim - 2))).reshape(w.shape)
        b64 = b64 * s
    if t is not None:
        b64 = b64 + t
    base = conv.name or conv.op_type.lower()
    if s is not None:
        conv.replace_input_with(1, add_initializer(graph, w64.astype(w.dtype), f"{base}_W_folded"))
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(2, add_initializer(graph, b64.astype(w.dtype), f"{base}_B_folded"))


def _gemm_refusal(gemm: ir.Node, s: np.ndarray, opset: int) -> str | None:
    if opset < 7 or len(gemm.inputs) < 2:  # before 7, Gemm's C broadcast was an attribute
        return "opset < 7: Gemm's C does not broadcast"
    w = const_array(gemm.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim != 2:
        return "the Gemm's B is not a constant 2-D float"
    trans_b = int(attr(gemm, "transB", 0))
    m = w.shape[0] if trans_b else w.shape[1]
    if s.shape != (m,):
        return f"{s.shape[0]} channels to fold, the Gemm has {m} columns"
    has_c = len(gemm.inputs) > 2 and gemm.inputs[2] is not None
    if has_c and const_array(gemm.inputs[2]) is None:
        return "the Gemm's C is not a constant"
    return None


def _fold_gemm(graph, gemm: ir.Node, s: np.ndarray, t: np.ndarray) -> None:
    w = const_array(gemm.inputs[1])
    trans_b = int(attr(gemm, "transB", 0))
    has_c = len(gemm.inputs) > 2 and gemm.inputs[2] is not None
    c = const_array(gemm.inputs[2]) if has_c else None
    beta = float(attr(gemm, "beta", 1.0))
    w64 = w.astype(np.float64) * (s[:, None] if trans_b else s[None, :])
    # Gemm's C is unidirectionally broadcastable to (N, M); broadcasting it against (M,) keeps it so.
    c64 = t if c is None else beta * c.astype(np.float64) * s + t
    base = gemm.name or "gemm"
    gemm.replace_input_with(1, add_initializer(graph, w64.astype(w.dtype), f"{base}_B_folded"))
    if len(gemm.inputs) < 3:
        gemm.resize_inputs(3)
    gemm.replace_input_with(2, add_initializer(graph, c64.astype(w.dtype), f"{base}_C_folded"))
    gemm.attributes["beta"] = ir.AttrFloat32("beta", 1.0)


def _matmul_refusal(mm: ir.Node, s: np.ndarray) -> str | None:
    x, w_value = mm.inputs
    w = const_array(w_value)
    if w is None or w.dtype.kind != "f" or w.ndim != 2:
        return "the MatMul's weight is not a constant 2-D float"
    # BatchNormalization's channel axis is 1; it is W's column axis only for a rank-2 product.
    if known_rank(x) != 2:
        return "the MatMul's input is not known to be 2-D: channel axis 1 is not W's column axis"
    if s.shape != (w.shape[1],):
        return f"{s.shape[0]} channels to fold, the MatMul has {w.shape[1]} columns"
    return None


def _matmul_to_gemm(graph, mm: ir.Node, bn: ir.Node, s: np.ndarray, t: np.ndarray) -> ir.Node:
    x, w_value = mm.inputs
    w = const_array(w_value)
    base = mm.name or "matmul"
    w_new = add_initializer(
        graph, (w.astype(np.float64) * s[None, :]).astype(w.dtype), f"{base}_B_folded"
    )
    c_new = add_initializer(graph, t.astype(w.dtype), f"{base}_C_folded")
    return insert_node(graph, mm, "Gemm", [x, w_new, c_new], like=bn.outputs[0])


@dataclass
class _Match:
    bn: ir.Node
    linear: ir.Node  # the Conv, ConvTranspose, Gemm or MatMul before it
    # derived by the check
    s: np.ndarray | None = None
    t: np.ndarray | None = None


class FuseConvBatchNorm(FusionPass[_Match]):
    """Conv/ConvTranspose/Gemm/MatMul + inference BatchNormalization → the linear op alone."""

    name = "fuse-conv-bn"
    ops = ("BatchNormalization",)

    def matches(self, graph, bn: ir.Node) -> Iterator[_Match]:
        linear = producer_of(bn.inputs[0], "Conv", "ConvTranspose", "Gemm", "MatMul")
        if linear is not None:
            yield _Match(bn, linear)

    def check(self, graph, m: _Match) -> str | None:
        # The un-normalized output must have no other reader (and be no graph output).
        reason = absorb_refusal(graph, m.linear, m.bn.inputs[0])
        if reason is not None:
            return reason
        opset = graph_opset(graph, self.model)
        reason = bn_refusal(m.bn, opset)
        if reason is not None:
            return reason
        m.s, m.t = bn_affine(m.bn)
        if m.linear.op_type in ("Conv", "ConvTranspose"):
            return channel_affine_refusal(m.linear, m.s, m.t)
        if m.linear.op_type == "Gemm":
            return _gemm_refusal(m.linear, m.s, opset)
        return _matmul_refusal(m.linear, m.s)

    def rewrite(self, graph, m: _Match) -> int:
        x, y = m.bn.inputs[0], m.bn.outputs[0]
        if m.linear.op_type == "MatMul":
            gemm = _matmul_to_gemm(graph, m.linear, m.bn, m.s, m.t)
            replace_with_new(y, gemm.outputs[0])
            graph.remove([m.bn, m.linear], safe=True)
            return 1
        if m.linear.op_type == "Gemm":
            _fold_gemm(graph, m.linear, m.s, m.t)
        else:
            fold_channel_affine(graph, m.linear, m.s, m.t)
        replace_value(y, x)
        graph.remove(m.bn, safe=True)
        return 1
