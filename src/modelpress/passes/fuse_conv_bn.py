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

Legal only when: the BatchNormalization is in inference mode (``training_mode=0``, no extra
outputs, ``is_test=1`` before opset 7, ``spatial=1`` before opset 9) with constant scale, bias, mean
and variance; the linear op's weight (and bias, if any) is constant and floating point; and the
linear op's output has no other reader and is no graph output (otherwise the un-normalized value
would still be needed). The folding is done in float64 and cast back to the weight's dtype.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node, replace_value, replace_with_new
from modelpress.ir.match import (
    attr,
    const_array,
    graph_opset,
    is_single_use,
    known_rank,
    producer_of,
)
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register


def bn_affine(bn: ir.Node, opset: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(s, t)`` in float64 for an inference-mode BatchNormalization with constant parameters."""
    if bn.domain not in ("", "ai.onnx") or bn.op_type != "BatchNormalization" or len(bn.inputs) != 5:
        return None
    # Extra outputs (running mean/var, saved statistics) exist only in training mode, where Y is
    # normalized with the batch's own statistics: nothing constant to fold.
    if len(bn.outputs) != 1 or attr(bn, "training_mode", 0) != 0:
        return None
    if opset < 7 and attr(bn, "is_test", 0) != 1:
        return None
    if attr(bn, "spatial", 1) != 1:  # spatial=0 (before opset 9) normalizes per element, not per channel
        return None
    params = [const_array(v) for v in bn.inputs[1:]]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    if not (scale.shape == bias.shape == mean.shape == var.shape):
        return None
    eps = float(attr(bn, "epsilon", 1e-5))
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def fold_channel_affine(
    graph: ir.Graph | ir.Function, conv: ir.Node, s: np.ndarray | None, t: np.ndarray | None
) -> bool:
    """Rewrite ``conv`` (Conv or ConvTranspose, constant weight) so it also computes ``y·s + t``
    per output channel. ``s``/``t``: float64 arrays of length M, or None for 1 / 0.
    Returns False (and changes nothing) when the weights do not allow it."""
    if conv.op_type not in ("Conv", "ConvTranspose") or len(conv.inputs) < 2:
        return False
    w = const_array(conv.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim < 3:
        return False
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    b = const_array(conv.inputs[2]) if has_bias else None
    if has_bias and b is None:
        return False
    group = int(attr(conv, "group", 1))
    if conv.op_type == "Conv":
        m = w.shape[0]
    else:
        if group < 1 or w.shape[0] % group:
            return False
        m = w.shape[1] * group
    for v in (s, t):
        if v is not None and v.shape != (m,):
            return False
    if b is not None and b.shape != (m,):
        return False
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
    return True


def _fold_gemm(graph, gemm: ir.Node, s: np.ndarray, t: np.ndarray, opset: int) -> bool:
    if opset < 7 or len(gemm.inputs) < 2:  # before 7, Gemm's C broadcast was an attribute
        return False
    w = const_array(gemm.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim != 2:
        return False
    trans_b = int(attr(gemm, "transB", 0))
    m = w.shape[0] if trans_b else w.shape[1]
    if s.shape != (m,):
        return False
    has_c = len(gemm.inputs) > 2 and gemm.inputs[2] is not None
    c = const_array(gemm.inputs[2]) if has_c else None
    if has_c and c is None:
        return False
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
    return True


def _matmul_to_gemm(graph, mm: ir.Node, bn: ir.Node, s: np.ndarray, t: np.ndarray) -> ir.Node | None:
    x, w_value = mm.inputs
    w = const_array(w_value)
    # BatchNormalization's channel axis is 1; it is W's column axis only for a rank-2 product.
    if w is None or w.dtype.kind != "f" or w.ndim != 2 or known_rank(x) != 2 or s.shape != (w.shape[1],):
        return None
    base = mm.name or "matmul"
    w_new = add_initializer(graph, (w.astype(np.float64) * s[None, :]).astype(w.dtype), f"{base}_B_folded")
    c_new = add_initializer(graph, t.astype(w.dtype), f"{base}_C_folded")
    return insert_node(graph, mm, "Gemm", [x, w_new, c_new], like=bn.outputs[0])


@register
class FuseConvBatchNorm(GraphPass):
    """Conv/ConvTranspose/Gemm/MatMul + inference BatchNormalization → the linear op alone."""

    name = "fuse-conv-bn"
    level = 2

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        opset = graph_opset(graph, self.model)
        count = 0
        for bn in list(graph):
            if bn.graph is not graph or bn.op_type != "BatchNormalization":
                continue
            x = bn.inputs[0]
            prod = producer_of(x, "Conv", "ConvTranspose", "Gemm", "MatMul")
            # The un-normalized output must have no other reader (and be no graph output).
            if prod is None or prod.graph is not graph or not is_single_use(x):
                continue
            affine = bn_affine(bn, opset)
            if affine is None:
                continue
            s, t = affine
            y = bn.outputs[0]
            if prod.op_type in ("Conv", "ConvTranspose"):
                if not fold_channel_affine(graph, prod, s, t):
                    continue
                replace_value(y, x)
                graph.remove(bn, safe=True)
            elif prod.op_type == "Gemm":
                if not _fold_gemm(graph, prod, s, t, opset):
                    continue
                replace_value(y, x)
                graph.remove(bn, safe=True)
            else:
                gemm = _matmul_to_gemm(graph, prod, bn, s, t)
                if gemm is None:
                    continue
                replace_with_new(y, gemm.outputs[0])
                graph.remove([bn, prod], safe=True)
            count += 1
        return count
