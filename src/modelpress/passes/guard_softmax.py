"""Masked Softmax: keep the masked scores within float32's normal range.

Attention adds a mask of huge negative numbers (``finfo.min``, ``-1e4``, ``-inf``) to the scores of
padded positions. Softmax computes ``exp(x - max)``; for those positions that is far below the
smallest normal float32, and x86 CPUs without flush-to-zero take a micro-code assist for every
denormal produced and consumed, which makes a masked Softmax several times slower than an
unmasked one.

Rule: ``Softmax(x, axis)``, where ``x = Add(scores, mask)`` and ``mask`` is computed from a
constant of at most -1e4 (the pattern), becomes ``Softmax(Max(x, ReduceMax(x, axis) - 80), axis)``.
Precondition (``check``): the probabilities are only read by MatMul/Einsum (they weight values, as
in attention; a Log of them would see ``-80`` instead of ``-inf``), x is float32, and the softmax
row is one axis (before opset 13 it is everything after ``axis``).

Exact to float32 rounding: a clamped score gets weight ``e^-80 / Z`` with ``Z >= 1`` (the row's
maximum contributes 1), and ``e^-80 ≈ 1.8e-35``: even a row of 10^20 clamped scores changes the sum
by less than float32's resolution. Scores within 80 of the maximum are untouched, so unmasked rows
are bit-identical. Only float32 Softmax is rewritten (float16's normal range is too short for the
margin to be negligible). The extra ``ReduceMax``/``Sub``/``Max`` are cheap element-wise ops, far
cheaper than the denormals they avoid.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node
from modelpress.ir.match import const_array, graph_opset, producer_of
from modelpress.ir.shapes import ensure_types
from modelpress.passes.rule import RewritePass

MASK_THRESHOLD = -1e4  # a constant this negative (or -inf) marks an additive attention mask
MARGIN = 80.0  # e^-80 is normal in float32 (smallest normal ≈ e^-87.3)
_SEARCH_DEPTH = 6


def _is_mask(value: ir.Value | None, depth: int = 0) -> bool:
    """Whether ``value`` is computed (within a few standard ops) from a constant <= -1e4."""
    if value is None or depth > _SEARCH_DEPTH:
        return False
    array = const_array(value)
    if array is not None:
        return array.dtype.kind == "f" and array.size > 0 and float(np.min(array)) <= MASK_THRESHOLD
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    return any(_is_mask(v, depth + 1) for v in node.inputs)


def _weights_values(node: ir.Node) -> bool:
    """Whether the probabilities only weight values (attention: every reader is a MatMul or
    Einsum), where a clamped key's ``e^-80`` instead of 0 changes nothing. A Log of them would
    turn -inf into -80: not the same model."""
    y = node.outputs[0]
    return not y.is_graph_output() and all(
        use.node.op_type in ("MatMul", "Einsum") for use in y.uses()
    )


def _softmax_axis(node: ir.Node, opset: int) -> int | None:
    axis = node.attributes.get_int("axis", -1 if opset >= 13 else 1)
    # before opset 13 Softmax flattens to 2-D at `axis`; the row is then "everything after axis",
    # which matches one ReduceMax axis only when `axis` is the last one
    if opset < 13 and axis != -1:
        rank = None if node.inputs[0].shape is None else len(node.inputs[0].shape)
        if rank is None or axis != rank - 1:
            return None
    return axis


class GuardSoftmax(RewritePass[ir.Node]):
    """Clamp masked Softmax inputs to ``max - 80`` so that no denormal is computed."""

    name = "guard-softmax"
    ops = ("Softmax",)

    def matches(self, graph, node: ir.Node) -> Iterator[ir.Node]:
        add = producer_of(node.inputs[0], "Add")
        if add is not None and any(_is_mask(v) for v in add.inputs):
            yield node

    def check(self, graph, node: ir.Node) -> str | None:
        if not _weights_values(node):
            return "the probabilities are read by more than MatMul/Einsum: e^-80 for 0 would show"
        x = node.inputs[0]
        if x.dtype is None:
            ensure_types(self.model)  # files often leave intermediate values untyped
        if x.dtype != ir.DataType.FLOAT:
            return "not float32: float16's normal range is too short for the margin"
        if _softmax_axis(node, graph_opset(graph, self.model)) is None:
            return "before opset 13 the row is everything after axis, and axis is not the last one"
        return None

    def rewrite(self, graph, node: ir.Node) -> int:
        x = node.inputs[0]
        axis = _softmax_axis(node, graph_opset(graph, self.model))
        if graph_opset(graph, self.model) >= 18:
            axes = add_initializer(graph, np.array([axis], np.int64), f"{node.name}_axes")
            peak = insert_node(graph, node, "ReduceMax", [x, axes], {"keepdims": 1})
        else:
            peak = insert_node(graph, node, "ReduceMax", [x], {"axes": [axis], "keepdims": 1})
        margin = add_initializer(graph, np.array(MARGIN, np.float32), f"{node.name}_margin")
        floor = insert_node(graph, node, "Sub", [peak.outputs[0], margin])
        clamped = insert_node(graph, node, "Max", [x, floor.outputs[0]], like=x)
        node.replace_input_with(0, clamped.outputs[0])
        return 1
