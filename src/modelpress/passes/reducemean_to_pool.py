"""A ReduceMean over every spatial axis → GlobalAveragePool (+ Flatten when the axes are dropped).

Exporters write global average pooling as ``x.mean((2, 3))``: a ReduceMean over axes 2..r-1 of an
``[N, C, ...]`` tensor. GlobalAveragePool computes exactly that mean with ``keepdims=1``, and it is
the form that runtimes have dedicated kernels for (ONNX Runtime's NCHWc and int8
``QLinearGlobalAveragePool``; a ReduceMean in an int8 CNN is a float op that breaks the 8-bit chain
of a squeeze-excite block). With ``keepdims=0`` the result is ``Flatten(axis=1)`` of the pool: its
shape ``[N, C, 1, ...]`` flattens to ``[N, C]``.

Precondition (``check``): the input's rank ``r`` is known, the axes (attribute before opset 18,
constant input from 18) are exactly ``2..r-1`` in any order or sign, and the dtype is one
GlobalAveragePool takes (bfloat16 from opset 22). Left alone on purpose: rank 3 (``[B, T, D]``: the
last-axis mean of a LayerNorm written out, which ONNX Runtime fuses only as a ReduceMean) and any
mean subtracted from its own input (a normalization). The mean is the same sum divided by the same
count, so results differ by float summation order only.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from modelpress.ir.graph import insert_node, replace_with_new
from modelpress.ir.match import graph_opset, ints_arg, known_rank
from modelpress.ir.shapes import ensure_types
from modelpress.passes.rule import RewritePass

_POOL_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)


def _spatial_mean_refusal(node: ir.Node, opset: int) -> str | None:
    """Why ``node`` (a ReduceMean) is not a mean over every spatial axis to pool, or None."""
    x = node.inputs[0] if node.inputs else None
    rank = known_rank(x)
    if rank is None or x.dtype is None:
        return "the input's rank or dtype is not known"
    # rank 3 is left alone: a mean over the last axis of [B, T, D] is a LayerNorm's, and ONNX
    # Runtime fuses LayerNorms written as primitives only when that mean is a ReduceMean
    if rank < 4:
        return f"rank {rank}: only [N, C, spatial...] of rank >= 4 is pooled"
    if x.dtype not in _POOL_DTYPES and not (x.dtype == ir.DataType.BFLOAT16 and opset >= 22):
        return f"GlobalAveragePool does not take {x.dtype.name} (at opset {opset})"
    given, axes = ints_arg(node, "axes", 1)
    if not given or axes is None:  # no axes: a mean over everything (or nothing), not a pool
        return "the axes are not given as constants"
    if sorted(a % rank for a in axes) != list(range(2, rank)) or len(set(axes)) != len(axes):
        return f"the axes {axes} are not exactly the spatial axes 2..{rank - 1}"
    # x - mean(x): a normalization (LayerNorm/GroupNorm written out), which runtimes fuse as is
    if any(use.node.op_type == "Sub" and x in use.node.inputs for use in node.outputs[0].uses()):
        return "the mean is subtracted from its own input (a normalization)"
    return None


class ReduceMeanToPool(RewritePass[ir.Node]):
    """``ReduceMean(x, axes=2..r-1)`` → ``GlobalAveragePool(x)`` (``Flatten`` after when not kept)."""

    name = "reducemean-to-pool"
    level = 2
    ops = ("ReduceMean",)

    def matches(self, graph, node: ir.Node) -> Iterator[ir.Node]:
        x = node.inputs[0] if node.inputs else None
        if x is not None and (x.dtype is None or known_rank(x) is None):
            ensure_types(self.model)  # only when a ReduceMean needs them: inference costs
        yield node

    def check(self, graph, node: ir.Node) -> str | None:
        return _spatial_mean_refusal(node, graph_opset(graph, self.model))

    def rewrite(self, graph, node: ir.Node) -> int:
        y = node.outputs[0]
        keep = node.attributes.get_int("keepdims", 1)
        pool = insert_node(
            graph, node, "GlobalAveragePool", [node.inputs[0]], like=y if keep else None
        )
        out = pool.outputs[0]
        if y.name:
            out.name = f"{y.name}_pooled"
        if not keep:
            out = insert_node(graph, node, "Flatten", [out], {"axis": 1}, like=y).outputs[0]
        replace_with_new(y, out)
        graph.remove(node, safe=True)
        return 1
