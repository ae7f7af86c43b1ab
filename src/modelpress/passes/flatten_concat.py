"""Nested Concats on the same axis flatten: ``Concat(Concat(a, b), c)`` → ``Concat(a, b, c)``.

Legal when both concatenate along the same axis (negative axes are normalized with the rank when
it is known; otherwise both must be written the same way) and the inner Concat's result is used
only by the outer one: otherwise the inner copy would still be made and the rewrite would add work.
"""

from __future__ import annotations

import onnx_ir as ir

from modelpress.ir.graph import insert_node, remove_node, replace_with_new
from modelpress.ir.match import in_graph, is_single_use, known_rank
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register


def _axis(node: ir.Node) -> int | None:
    axis = node.attributes.get_int("axis", None)
    if axis is None:
        return None
    rank = known_rank(node.outputs[0])
    if rank is None:
        rank = next((r for r in map(known_rank, node.inputs) if r is not None), None)
    return axis + rank if axis < 0 and rank is not None else axis


def _is_inner(value: ir.Value | None, axis: int, graph) -> bool:
    if value is None or not is_single_use(value):
        return False
    node = value.producer()
    return (
        node is not None
        and node.op_type == "Concat"
        and node.domain == ""
        and in_graph(node, graph)
        and _axis(node) == axis
    )


@register
class FlattenConcat(GraphPass):
    """Concat(Concat(a, b), c) on one axis, the inner used once → Concat(a, b, c)."""

    name = "flatten-concat"

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        count = 0
        # Topological order: an inner Concat absorbs its own inner ones before its outer one
        # absorbs it, so a whole tree flattens in one sweep.
        for outer in list(graph):
            if outer.op_type != "Concat" or outer.domain != "" or not in_graph(outer, graph):
                continue
            axis = _axis(outer)
            if axis is None:
                continue
            inners = [v for v in outer.inputs if _is_inner(v, axis, graph)]
            if not inners:
                continue
            inputs: list[ir.Value | None] = []
            for v in outer.inputs:
                inputs.extend(v.producer().inputs if v in inners else [v])
            out = outer.outputs[0]
            new = insert_node(
                graph, outer, "Concat", inputs, {"axis": outer.attributes.get_int("axis")}, like=out
            )
            replace_with_new(out, new.outputs[0])
            remove_node(graph, outer)
            for v in inners:
                remove_node(graph, v.producer())
            count += len(inners)
        return count
