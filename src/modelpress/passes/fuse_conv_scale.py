"""Fold a constant per-channel (or scalar) Mul, Add, Sub or Div after a Conv into its weights and bias.

``Mul(Conv(x, W, b), k)`` = ``Conv(x, W·k, b·k)`` and ``Add(Conv(x, W, b), c)`` = ``Conv(x, W, b + c)``
when ``k`` and ``c`` are constant per output channel: their shape, right-aligned against the
output (N, M, spatial...), has size 1 everywhere except possibly M on the channel axis, i.e.
(M,1,1), (1,M,1,1), a scalar, or a one-element tensor. ``Sub(y, c)`` folds as ``Add(y, -c)`` and
``Div(y, k)`` as ``Mul(y, 1/k)`` (one extra rounding of ``1/k``, far below fp32 tolerance). Only the
conv output as the *first* operand of Sub/Div is folded (``c - y`` would negate the weights as
well: legal, but no exporter writes it).

Precondition (``check``): the Conv's weight and bias are constant floats; the constant is finite,
has the conv's dtype and no more dimensions than the conv output (otherwise broadcasting would
change the output shape); and the conv output has no other reader and is no graph output.
ConvTranspose folds the same way (its output channels are laid out per group, see
``fuse_conv_bn``). Chains such as Conv → Mul → Add fold one op per step until the fixed point.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import replace_value
from modelpress.ir.match import attr, const_array, producer_of
from modelpress.passes.fuse_conv_bn import channel_affine_refusal, fold_channel_affine
from modelpress.passes.rule import FusionPass, absorb_refusal


def per_channel(c: np.ndarray, channels: int, out_rank: int) -> np.ndarray | None:
    """``c`` as a float64 vector of length ``channels`` when it broadcasts per output channel."""
    if c.ndim > out_rank or c.dtype.kind != "f":
        return None
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,)).copy()


@dataclass
class _Match:
    node: ir.Node  # the Mul, Add, Sub or Div
    conv: ir.Node
    position: int  # the conv output's operand position
    # derived by the check: the per-channel scale and shift to fold
    s: np.ndarray | None = None
    t: np.ndarray | None = None


class FuseConvScale(FusionPass[_Match]):
    """Conv followed by a constant per-channel Mul/Add/Sub/Div → Conv with folded weights."""

    name = "fuse-conv-scale"
    ops = ("Mul", "Add", "Sub", "Div")

    def matches(self, graph, node: ir.Node) -> Iterator[_Match]:
        if len(node.inputs) != 2:
            return
        for position in (0, 1):
            # y - c and y / c fold; c - y and c / y do not (see the module docstring).
            if position == 1 and node.op_type in ("Sub", "Div"):
                continue
            conv = producer_of(node.inputs[position], "Conv", "ConvTranspose")
            if conv is not None:
                yield _Match(node, conv, position)

    def check(self, graph, m: _Match) -> str | None:
        y, other = m.node.inputs[m.position], m.node.inputs[1 - m.position]
        if y is other:
            return f"the {m.conv.op_type} output is both operands"
        reason = absorb_refusal(graph, m.conv, y)
        if reason is not None:
            return reason
        w = const_array(m.conv.inputs[1]) if len(m.conv.inputs) > 1 else None
        if w is None or w.ndim < 3:
            return f"the {m.conv.op_type} weight is not a constant of rank >= 3"
        c = const_array(other)
        if c is None:
            return "the other operand is not a constant"
        if c.dtype != w.dtype:
            return f"the constant is {c.dtype}, the weight {w.dtype}"
        group = int(attr(m.conv, "group", 1))
        channels = w.shape[0] if m.conv.op_type == "Conv" else w.shape[1] * group
        vec = per_channel(c, channels, w.ndim)
        if vec is None:
            return f"the constant, shaped {c.shape}, is not per output channel of a rank-{w.ndim} output"
        # A division by zero must stay visible at run time (inf/nan), not be folded.
        if not np.all(np.isfinite(vec)) or (m.node.op_type == "Div" and np.any(vec == 0)):
            return "the constant is not finite, or divides by zero"
        if m.node.op_type == "Mul":
            s, t = vec, None
        elif m.node.op_type == "Div":
            s, t = 1.0 / vec, None
        elif m.node.op_type == "Add":
            s, t = None, vec
        else:
            s, t = None, -vec
        m.s, m.t = s, t
        return channel_affine_refusal(m.conv, s, t)

    def rewrite(self, graph, m: _Match) -> int:
        fold_channel_affine(graph, m.conv, m.s, m.t)
        replace_value(m.node.outputs[0], m.conv.outputs[0])
        graph.remove(m.node, safe=True)
        return 1
