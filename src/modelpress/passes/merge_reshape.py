"""Reshape chains collapse into their last Reshape.

``Reshape(f(x), s)`` → ``Reshape(x, s)`` when ``f`` only changes the shape, never the order of the
elements (Reshape, Flatten, Squeeze, Unsqueeze, Identity): the elements in row-major order stay the
same, and the last Reshape alone decides the final shape.

Precondition (``check``): the last Reshape's target shape ``s`` is a constant that does not look
at its input's shape: no ``0`` entries (which copy the input's dimension) unless ``allowzero=1``,
where a 0 is a literal zero. ``-1`` is fine: it is inferred from the element count, which ``f`` does not change.
Also legal, from opset 14, when ``s`` is ``Shape(t)`` of some tensor (exporters write
``Reshape(x, Shape(t))`` for "reshape like t"): its entries are real dimensions, so there is no -1,
and a 0 entry can only come from an empty dimension; the merged Reshape gets ``allowzero=1`` so a 0
stays a literal 0, which is what the original computes whenever it computes anything at all (a 0
copied from the intermediate would make the element counts disagree otherwise).
The intermediate node goes once nothing else uses it. A Reshape that changes nothing is the no-op
pass's business, not this one's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import remove_node
from modelpress.ir.match import const_array, in_graph
from modelpress.passes.rule import RewritePass

# Ops whose output holds the input's elements in the same row-major order.
_SHAPE_ONLY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def _shape_only(value: ir.Value | None, graph) -> ir.Node | None:
    node = value.producer() if value is not None else None
    if (
        node is None
        or node.op_type not in _SHAPE_ONLY
        or node.domain != ""
        or not in_graph(node, graph)
    ):
        return None
    if len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    return node


@dataclass
class _Match:
    reshape: ir.Node
    chain: list[ir.Node]  # the shape-only nodes between the source and the Reshape, last first
    # derived by the check
    like_tensor: bool = False  # the target is Shape(t)


class MergeReshape(RewritePass[_Match]):
    """Reshape(Reshape|Flatten|Squeeze|Unsqueeze(x), s) → Reshape(x, s) when s is self-contained."""

    name = "merge-reshape"
    ops = ("Reshape",)

    def matches(self, graph, node: ir.Node) -> Iterator[_Match]:
        chain = []
        source = node.inputs[0]
        while (inner := _shape_only(source, graph)) is not None:
            chain.append(inner)
            source = inner.inputs[0]
        if chain:
            yield _Match(node, chain)

    def check(self, graph, m: _Match) -> str | None:
        target = m.reshape.inputs[1] if len(m.reshape.inputs) > 1 else None
        shape = const_array(target)
        if shape is None:
            if not self._is_full_shape(target):
                return "the target shape is neither a constant nor Shape(t) (from opset 14)"
            m.like_tensor = True
        elif not m.reshape.attributes.get_int("allowzero", 0) and (shape == 0).any():
            return (
                "a 0 in the target copies a dimension of the intermediate tensor, which is bypassed"
            )
        return None

    def rewrite(self, graph, m: _Match) -> int:
        node = m.reshape
        node.replace_input_with(0, m.chain[-1].inputs[0])
        if m.like_tensor:
            node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
        for inner in m.chain:
            if inner.outputs[0].uses() or inner.outputs[0].is_graph_output():
                break
            remove_node(graph, inner)
        return 1

    def _is_full_shape(self, value: ir.Value | None) -> bool:
        """``value`` is ``Shape(t)`` with no start/end, and allowzero exists (opset >= 14)."""
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Shape" or node.domain != "" or self.opset("") < 14:
            return False
        return "start" not in node.attributes and "end" not in node.attributes
