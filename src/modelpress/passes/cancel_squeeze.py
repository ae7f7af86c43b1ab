"""Squeeze/Unsqueeze pairs cancel, and runs of Squeezes or Unsqueezes merge into one.

- ``Squeeze(Unsqueeze(x, a), a)`` → ``x``: both axis lists index the same (larger) rank.
- ``Unsqueeze(Squeeze(x, a), a)`` → ``x``: Squeeze fails unless those axes of ``x`` have size 1, so
  putting them back gives ``x`` exactly.
- ``Unsqueeze(Unsqueeze(x, a1), a2)`` → ``Unsqueeze(x, a)`` and ``Squeeze(Squeeze(x, a1), a2)`` →
  ``Squeeze(x, a)``, where ``a`` names the same axes in the outer (resp. inner) rank.

Precondition (``check``): the axes are known: given as constants (the attribute before opset 13,
the input from 13) and, when any is negative, the rank is known to normalize them. A Squeeze
without axes (squeeze every size-1 axis) depends on the data's shape and is only cancelled when
every dimension of ``x`` is a known integer. The outer node is rewritten; the inner one goes once nothing else uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import (
    add_initializer,
    insert_node,
    replace_value,
    replace_with_new,
)
from modelpress.ir.match import (
    graph_opset,
    ints_arg,
    known_rank,
    static_shape,
)
from modelpress.passes.rule import Pair, PairRewritePass

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


@dataclass
class _Match(Pair):
    # derived by the check: the merged node's axes (None when the pair cancels)
    axes: list[int] | None = None


def _axes(node: ir.Node) -> list[int] | None:
    return _unsqueeze_axes(node) if node.op_type == "Unsqueeze" else _squeeze_axes(node)


class CancelSqueeze(PairRewritePass[_Match]):
    """Squeeze∘Unsqueeze and Unsqueeze∘Squeeze with the same axes cancel; runs of either merge."""

    name = "cancel-squeeze"
    ops = _OPS
    match_type = _Match

    def check_pair(self, graph, m: _Match) -> str | None:
        inner_axes, outer_axes = _axes(m.inner), _axes(m.outer)
        if inner_axes is None or outer_axes is None:
            return "the axes are unknown: not constants, negative with an unknown rank, or all size-1 axes of a dynamic shape"
        if m.inner.op_type != m.outer.op_type:
            if inner_axes != outer_axes:
                return f"{m.inner.op_type} axes {inner_axes} and {m.outer.op_type} axes {outer_axes} differ"
        elif m.outer.op_type == "Unsqueeze":
            # outer's axes index the final rank; inner's index the intermediate one, whose axes
            # are the final positions that the outer did not take, in order.
            m.axes = sorted(outer_axes + _nth_free(outer_axes, inner_axes))
        else:
            # inner's axes index x; outer's index what is left of x after them, i.e. x's other
            # axes in order.
            m.axes = sorted(inner_axes + _nth_free(inner_axes, outer_axes))
        return None

    def rewrite(self, graph, m: _Match) -> int:
        x, out = m.inner.inputs[0], m.outer.outputs[0]
        if m.axes is None:
            if not replace_value(out, x):
                new = insert_node(graph, m.outer, "Identity", [x], like=out)
                replace_with_new(out, new.outputs[0])
        elif graph_opset(graph, self.model) >= 13:
            axes_value = add_initializer(
                graph, np.array(m.axes, dtype=np.int64), f"{out.name}_axes"
            )
            new = insert_node(graph, m.outer, m.outer.op_type, [x, axes_value], like=out)
            replace_with_new(out, new.outputs[0])
        else:
            new = insert_node(graph, m.outer, m.outer.op_type, [x], {"axes": m.axes}, like=out)
            replace_with_new(out, new.outputs[0])
        return self.remove_pair(graph, m)
