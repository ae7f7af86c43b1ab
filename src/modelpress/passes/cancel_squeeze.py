"""Squeeze/Unsqueeze pairs cancel, and runs of Squeezes or Unsqueezes merge into one.

- ``Squeeze(Unsqueeze(x, a), a)`` → ``x``: both axis lists index the same (larger) rank.
- ``Unsqueeze(Squeeze(x, a), a)`` → ``x``: Squeeze fails unless those axes of ``x`` have size 1, so
  putting them back gives ``x`` exactly.
- ``Unsqueeze(Unsqueeze(x, a1), a2)`` → ``Unsqueeze(x, a)`` and ``Squeeze(Squeeze(x, a1), a2)`` →
  ``Squeeze(x, a)``, where ``a`` names the same axes in the outer (resp. inner) rank.

Legal when the axes are known: given as constants (the attribute before opset 13, the input from
13) and, when any is negative, the rank is known to normalize them. A Squeeze without axes (squeeze
every size-1 axis) depends on the data's shape and is only cancelled when every dimension of ``x``
is a known integer. The outer node is rewritten; the inner one goes once nothing else uses it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import (
    add_initializer,
    insert_node,
    remove_node,
    replace_value,
    replace_with_new,
)
from modelpress.ir.match import graph_opset, in_graph, ints_arg, known_rank, static_shape
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register

_OPS = ("Squeeze", "Unsqueeze")


def _normalize(axes: list[int], rank: int | None) -> list[int] | None:
    if any(a < 0 for a in axes):
        if rank is None:
            return None
        axes = [a + rank if a < 0 else a for a in axes]
    if len(set(axes)) != len(axes) or (rank is not None and any(not 0 <= a < rank for a in axes)):
        return None
    return sorted(axes)


def _rank(value: ir.Value | None, depth: int = 0) -> int | None:
    """The rank of ``value``: annotated, or derived through the Squeeze/Unsqueeze producing it."""
    rank = known_rank(value)
    if rank is not None or value is None or depth > 8:
        return rank
    node = value.producer()
    if node is None or node.domain != "" or node.op_type not in _OPS:
        return None
    given, axes = ints_arg(node, "axes", 1)
    below = _rank(node.inputs[0], depth + 1)
    if not given or axes is None or below is None:
        return None
    return below + len(axes) if node.op_type == "Unsqueeze" else below - len(axes)


def _shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The static shape of ``value``: annotated, or derived through an Unsqueeze producing it."""
    shape = static_shape(value)
    if shape is not None or value is None:
        return shape
    node = value.producer()
    if node is None or node.domain != "" or node.op_type != "Unsqueeze":
        return None
    inner, axes = static_shape(node.inputs[0]), _unsqueeze_axes(node)
    if inner is None or axes is None:
        return None
    rest = iter(inner)
    return tuple(1 if i in axes else next(rest) for i in range(len(inner) + len(axes)))


def _squeeze_axes(node: ir.Node) -> list[int] | None:
    """The axes a Squeeze removes, normalized to its input's rank; None when unknown."""
    x = node.inputs[0]
    given, axes = ints_arg(node, "axes", 1)
    if not given:
        shape = _shape(x)
        return None if shape is None else [i for i, d in enumerate(shape) if d == 1]
    return None if axes is None else _normalize(axes, _rank(x))


def _unsqueeze_axes(node: ir.Node) -> list[int] | None:
    """The axes an Unsqueeze inserts, normalized to its output's rank; None when unknown."""
    given, axes = ints_arg(node, "axes", 1)
    if not given or axes is None:
        return None
    rank = _rank(node.inputs[0])
    return _normalize(axes, None if rank is None else rank + len(axes))


def _nth_free(taken: list[int], indices: list[int]) -> list[int]:
    """Positions of the ``indices``-th entries among the non-negative integers not in ``taken``."""
    taken_set, free, p = set(taken), [], 0
    while len(free) <= max(indices, default=-1):
        if p not in taken_set:
            free.append(p)
        p += 1
    return [free[i] for i in indices]


@register
class CancelSqueeze(GraphPass):
    """Squeeze∘Unsqueeze and Unsqueeze∘Squeeze with the same axes cancel; runs of either merge."""

    name = "cancel-squeeze"

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        count = 0
        for outer in list(graph):
            if outer.op_type not in _OPS or outer.domain != "" or not in_graph(outer, graph):
                continue
            x = outer.inputs[0]
            inner = x.producer() if x is not None else None
            if (
                inner is None
                or inner.op_type not in _OPS
                or inner.domain != ""
                or not in_graph(inner, graph)
            ):
                continue
            if self._rewrite(graph, inner, outer):
                count += 1
        return count

    def _rewrite(self, graph, inner: ir.Node, outer: ir.Node) -> bool:
        x = inner.inputs[0]
        out = outer.outputs[0]
        if inner.op_type != outer.op_type:
            a_in = _unsqueeze_axes(inner) if inner.op_type == "Unsqueeze" else _squeeze_axes(inner)
            a_out = _unsqueeze_axes(outer) if outer.op_type == "Unsqueeze" else _squeeze_axes(outer)
            if a_in is None or a_out is None or a_in != a_out:
                return False
            if not replace_value(out, x):
                new = insert_node(graph, outer, "Identity", [x], like=out)
                replace_with_new(out, new.outputs[0])
        elif outer.op_type == "Unsqueeze":
            a1, a2 = _unsqueeze_axes(inner), _unsqueeze_axes(outer)
            if a1 is None or a2 is None:
                return False
            # a2 indexes the final rank; a1 indexes the intermediate one, whose axes are the final
            # positions that a2 did not take, in order.
            merged = sorted(a2 + _nth_free(a2, a1))
            self._replace(graph, outer, "Unsqueeze", x, merged)
        else:
            a1, a2 = _squeeze_axes(inner), _squeeze_axes(outer)
            if a1 is None or a2 is None:
                return False
            # a1 indexes x; a2 indexes what is left of x after a1, i.e. x's other axes in order.
            merged = sorted(a1 + _nth_free(a1, a2))
            self._replace(graph, outer, "Squeeze", x, merged)
        remove_node(graph, outer)
        if not any(v.uses() or v.is_graph_output() for v in inner.outputs):
            remove_node(graph, inner)
        return True

    def _replace(self, graph, outer: ir.Node, op: str, x: ir.Value, axes: list[int]) -> None:
        out = outer.outputs[0]
        if graph_opset(graph, self.model) >= 13:
            axes_value = add_initializer(graph, np.array(axes, dtype=np.int64), f"{out.name}_axes")
            new = insert_node(graph, outer, op, [x, axes_value], like=out)
        else:
            new = insert_node(graph, outer, op, [x], {"axes": axes}, like=out)
        replace_with_new(out, new.outputs[0])
