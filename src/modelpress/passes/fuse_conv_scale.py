"""Fold a constant per-channel (or scalar) Mul, Add, Sub or Div after a Conv into its weights and bias.

``Mul(Conv(x, W, b), k)`` = ``Conv(x, W·k, b·k)`` and ``Add(Conv(x, W, b), c)`` = ``Conv(x, W, b + c)``
when ``k`` and ``c`` are constant per output channel: their shape, right-aligned against the
output (N, M, spatial...), has size 1 everywhere except possibly M on the channel axis, i.e.
(M,1,1), (1,M,1,1), a scalar, or a one-element tensor. ``Sub(y, c)`` folds as ``Add(y, -c)`` and
``Div(y, k)`` as ``Mul(y, 1/k)`` (one extra rounding of ``1/k``, far below fp32 tolerance). Only the
conv output as the *first* operand of Sub/Div is folded (``c - y`` would negate the weights as
well: legal, but no exporter writes it).

Legal only when: the Conv's weight and bias are constant floats; the constant has the conv's dtype
and no more dimensions than the conv output (otherwise broadcasting would change the output
shape); and the conv output has no other reader and is no graph output. ConvTranspose folds the
same way (its output channels are laid out per group, see ``fuse_conv_bn``). Chains such as Conv →
Mul → Add fold one op per step until the fixed point.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import replace_value
from modelpress.ir.match import attr, const_array, is_single_use, producer_of
from modelpress.passes.base import GraphPass
from modelpress.passes.fuse_conv_bn import fold_channel_affine
from modelpress.passes.registry import register


def per_channel(c: np.ndarray, channels: int, out_rank: int) -> np.ndarray | None:
    """``c`` as a float64 vector of length ``channels`` when it broadcasts per output channel."""
    if c.ndim > out_rank or c.dtype.kind != "f":
        return None
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,)).copy()


@register
class FuseConvScale(GraphPass):
    """Conv followed by a constant per-channel Mul/Add/Sub/Div → Conv with folded weights."""

    name = "fuse-conv-scale"
    level = 2

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        count = 0
        for node in list(graph):
            if node.graph is not graph or node.op_type not in ("Mul", "Add", "Sub", "Div") or node.domain not in ("", "ai.onnx"):
                continue
            if len(node.inputs) != 2:
                continue
            for pos in (0, 1):
                y, other = node.inputs[pos], node.inputs[1 - pos]
                # y - c and y / c fold; c - y and c / y do not (see the module docstring).
                if pos == 1 and node.op_type in ("Sub", "Div"):
                    continue
                conv = producer_of(y, "Conv", "ConvTranspose")
                if conv is None or conv.graph is not graph or y is other or not is_single_use(y):
                    continue
                if self._fold(graph, conv, node, other):
                    count += 1
                    break
        return count

    def _fold(self, graph, conv: ir.Node, node: ir.Node, other: ir.Value) -> bool:
        w = const_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
        c = const_array(other)
        if w is None or c is None or c.dtype != w.dtype or w.ndim < 3:
            return False
        group = int(attr(conv, "group", 1))
        channels = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * group
        vec = per_channel(c, channels, w.ndim)
        if vec is None:
            return False
        if node.op_type == "Mul":
            s, t = vec, None
        elif node.op_type == "Div":
            s, t = 1.0 / vec, None
        elif node.op_type == "Add":
            s, t = None, vec
        else:
            s, t = None, -vec
        if not np.all(np.isfinite(vec)) or (s is not None and not np.all(np.isfinite(s))):
            return False  # a division by zero must stay visible at run time (inf/nan), not be folded
        if not fold_channel_affine(graph, conv, s, t):
            return False
        replace_value(node.outputs[0], conv.outputs[0])
        graph.remove(node, safe=True)
        return True
