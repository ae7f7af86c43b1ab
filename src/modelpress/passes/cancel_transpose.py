"""Transpose∘Transpose → one Transpose with the composed permutation, or nothing when it is the identity.

``Transpose(Transpose(x, p1), p2)`` moves output axis ``j`` from axis ``p1[p2[j]]`` of ``x``, so it
equals ``Transpose(x, p1∘p2)``; when that is the identity permutation the pair is ``x`` itself.

Legal always: both are pure data movement. The outer Transpose is rewritten to read ``x``; the
inner one is removed when nothing else uses it (when something does, it stays for that user and
the rewrite still saves one pass over the data). A missing ``perm`` means "reverse the axes", which
needs the rank; two reversals cancel whatever the rank, otherwise the rank must be known.
"""

from __future__ import annotations

import onnx_ir as ir

from modelpress.ir.graph import insert_node, remove_node, replace_value, replace_with_new
from modelpress.ir.match import in_graph, known_rank
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register


def _perm(node: ir.Node, rank: int | None) -> list[int] | None:
    attr = node.attributes.get("perm")
    if attr is not None:
        return [int(p) for p in attr.as_ints()]
    return list(reversed(range(rank))) if rank is not None else None


@register
class CancelTranspose(GraphPass):
    """Transpose(Transpose(x, p1), p2) → Transpose(x, p1∘p2), or x when that is the identity."""

    name = "cancel-transpose"

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        count = 0
        for outer in list(graph):
            if outer.op_type != "Transpose" or outer.domain != "" or not in_graph(outer, graph):
                continue
            inner = outer.inputs[0].producer() if outer.inputs[0] is not None else None
            if (
                inner is None
                or inner.op_type != "Transpose"
                or inner.domain != ""
                or not in_graph(inner, graph)
            ):
                continue
            if self._fold(graph, inner, outer):
                count += 1
        return count

    def _fold(self, graph, inner: ir.Node, outer: ir.Node) -> bool:
        x = inner.inputs[0]
        both_default = "perm" not in inner.attributes and "perm" not in outer.attributes
        if both_default:
            composed = None  # reverse∘reverse: the identity at any rank
        else:
            rank = known_rank(x)
            if rank is None:
                given = inner.attributes.get("perm") or outer.attributes.get("perm")
                rank = len(given.as_ints())
            p1, p2 = _perm(inner, rank), _perm(outer, rank)
            if p1 is None or p2 is None or len(p1) != len(p2):
                return False
            composed = [p1[j] for j in p2]
        out = outer.outputs[0]
        identity = composed is None or composed == list(range(len(composed)))
        if identity and replace_value(out, x):
            remove_node(graph, outer)
        else:
            # Not the identity, or the identity of a graph input onto a graph output (whose names
            # are fixed): one Transpose (or Identity) reading x replaces the pair.
            if identity:
                new = insert_node(graph, outer, "Identity", [x], like=out)
            else:
                new = insert_node(graph, outer, "Transpose", [x], {"perm": composed}, like=out)
            replace_with_new(out, new.outputs[0])
            remove_node(graph, outer)
        if not any(v.uses() or v.is_graph_output() for v in inner.outputs):
            remove_node(graph, inner)
        return True
