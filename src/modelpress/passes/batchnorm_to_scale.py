"""BatchNormalization that no fusion took → one Mul and one Add ("a scale").

In inference mode BatchNormalization is the per-channel affine map ``y = x·s + t`` with
``s = scale / sqrt(var + eps)`` and ``t = B - mean·s`` (``fuse_conv_bn.bn_refusal`` says when:
inference mode, constant parameters). Written as ``Add(Mul(x, s), t)`` with ``s`` and ``t``
shaped ``(C, 1, ..., 1)`` (rank of x minus one) so they broadcast over channel axis 1, it computes
the same values with two plain element-wise ops that every runtime runs fast and that later passes
can merge with neighbouring scales (``merge-scale-chains``) or fuse into a Conv.

Precondition (``check``): that, x's rank is known (to shape the constants) and x is floating
point. The constants are computed in float64 and cast to x's dtype, so the result differs from
BatchNormalization only by float rounding.

A BatchNormalization right after a Conv, ConvTranspose, Gemm or rank-2 MatMul with a constant
weight and no other reader is left alone: ``fuse-conv-bn`` folds it into that op's weights, which
is better than two extra ops. Fusions run earlier in each round, so whatever such a node is still
here after them was refused for a reason this pass does not need to repeat.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node, replace_with_new
from modelpress.ir.match import const_array, graph_opset, is_single_use, known_rank
from modelpress.ir.shapes import ensure_types
from modelpress.passes.fuse_conv_bn import bn_affine, bn_refusal
from modelpress.passes.rule import RewritePass


def _fusion_will_take(x: ir.Value) -> bool:
    """Whether ``fuse-conv-bn`` can fold a BatchNormalization reading ``x`` into x's producer."""
    producer = x.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or not is_single_use(x):
        return False
    if (
        producer.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul")
        or len(producer.inputs) < 2
    ):
        return False
    if const_array(producer.inputs[1]) is None:
        return False
    # MatMul folds only when the channel axis 1 is its last axis (a rank-2 input).
    return producer.op_type != "MatMul" or known_rank(producer.inputs[0]) == 2


class BatchNormToScale(RewritePass[ir.Node]):
    """Replace an unfused inference BatchNormalization by ``Add(Mul(x, s), t)``."""

    name = "batchnorm-to-scale"
    level = 2
    ops = ("BatchNormalization",)

    def call(self, model: ir.Model):
        ensure_types(model)  # the constants' shape needs the input's rank
        return super().call(model)

    def matches(self, graph, bn: ir.Node) -> Iterator[ir.Node]:
        yield bn

    def check(self, graph, bn: ir.Node) -> str | None:
        reason = bn_refusal(bn, graph_opset(graph, self.model))
        if reason is not None:
            return reason
        x = bn.inputs[0]
        rank = known_rank(x)
        if x is None or rank is None or rank < 2:
            return "the input's rank is unknown or below 2 (it shapes the constants)"
        if _fusion_will_take(x):
            return "fuse-conv-bn folds it into the op before"
        if np.dtype(self._dtype(bn)).kind != "f":
            return "the input is not floating point"
        return None

    @staticmethod
    def _dtype(bn: ir.Node):
        x = bn.inputs[0]
        return x.dtype.numpy() if x.dtype is not None else const_array(bn.inputs[1]).dtype

    def rewrite(self, graph, bn: ir.Node) -> int:
        x, y = bn.inputs[0], bn.outputs[0]
        dtype = self._dtype(bn)
        s, t = bn_affine(bn)
        shape = (len(s),) + (1,) * (known_rank(x) - 2)
        base = bn.name or "bn"
        scale = add_initializer(graph, s.reshape(shape).astype(dtype), f"{base}_scale")
        shift = add_initializer(graph, t.reshape(shape).astype(dtype), f"{base}_shift")
        mul = insert_node(graph, bn, "Mul", [x, scale], like=y)
        # Named after y: onnx_ir's per-graph names ("val_0") may clash across subgraphs.
        if y.name:
            mul.outputs[0].name = f"{y.name}_scaled"
        add = insert_node(graph, bn, "Add", [mul.outputs[0], shift], like=y)
        replace_with_new(y, add.outputs[0])
        graph.remove(bn, safe=True)
        return 1
