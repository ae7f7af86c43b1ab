"""Nested Concats on the same axis flatten: ``Concat(Concat(a, b), c)`` → ``Concat(a, b, c)``.

Precondition (``check``): both concatenate along the same axis (negative axes are normalized with
the rank when it is known; otherwise both must be written the same way), in the same graph, and
the inner Concat's result is used only by the outer one: otherwise the inner copy would still be
made and the rewrite would add work.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import insert_node, remove_node, replace_with_new
from modelpress.ir.match import in_graph, is_single_use, known_rank, producer_of
from modelpress.passes.rule import RewritePass


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


@dataclass
class _Match:
    outer: ir.Node
    # derived by the check: the inner Concats' results it absorbs
    inners: list[ir.Value] | None = None


class FlattenConcat(RewritePass[_Match]):
    """Concat(Concat(a, b), c) on one axis, the inner used once → Concat(a, b, c)."""

    name = "flatten-concat"
    ops = ("Concat",)
    # Graph order is topological: an inner Concat absorbs its own inner ones before its outer one
    # absorbs it, so a whole tree flattens in one sweep.

    def matches(self, graph, outer: ir.Node) -> Iterator[_Match]:
        if any(producer_of(v, "Concat") is not None for v in outer.inputs):
            yield _Match(outer)

    def check(self, graph, m: _Match) -> str | None:
        axis = _axis(m.outer)
        if axis is None:
            return "the Concat has no axis attribute"
        m.inners = [v for v in m.outer.inputs if _is_inner(v, axis, graph)]
        if not m.inners:
            return "no inner Concat of this graph on the same axis is read by this one only"
        return None

    def rewrite(self, graph, m: _Match) -> int:
        inputs: list[ir.Value | None] = []
        for v in m.outer.inputs:
            inputs.extend(v.producer().inputs if v in m.inners else [v])
        out = m.outer.outputs[0]
        new = insert_node(
            graph, m.outer, "Concat", inputs, {"axis": m.outer.attributes.get_int("axis")}, like=out
        )
        replace_with_new(out, new.outputs[0])
        remove_node(graph, m.outer)
        for v in m.inners:
            remove_node(graph, v.producer())
        return len(m.inners)
