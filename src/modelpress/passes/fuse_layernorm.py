"""The primitive layer-normalization pattern → LayerNormalization (opset >= 17).

Old exporters (PyTorch at opset < 17, for instance) write ``nn.LayerNorm`` as::

    m = ReduceMean(x, axes)          d = Sub(x, m)          v = ReduceMean(Pow(d, 2) | Mul(d, d), axes)
    n = Div(d, Sqrt(Add(v, eps)))    [or Mul(d, Reciprocal(Sqrt(...))) / Mul(d, Div(1, Sqrt(...)))]
    y = Add(Mul(n, gamma), beta)     [gamma and beta optional, either operand order]

which is ``LayerNormalization(x, gamma, beta, axis=-k, epsilon=eps)`` when the ``axes`` are the k
trailing axes. ReduceMean's axes may be an attribute (opset < 18) or a constant input (>= 18).

Legal only when: the model's opset is >= 17 (the pass never upgrades it; ``optimize(opset=17)``
does); both ReduceMeans reduce the same trailing axes with ``keepdims=1``; ``eps``, the exponent
2, ``gamma`` and ``beta`` are constants; and every intermediate has exactly the readers the pattern
gives it (``d`` is read by the square and the division, everything else once) and is no graph
output. LayerNormalization needs a Scale of the normalized shape: it is taken from x's static
trailing dimensions when shape information has them, else from gamma's shape (then gamma must name
all k normalized dimensions; an x whose trailing size is 1 while gamma's is not would have been
broadcast by the original Mul, a degenerate case no exporter writes). Without gamma and without
static trailing dimensions the pattern is left alone. LayerNormalization computes in float32
(``stash_type=1``), which for float16 inputs is more precise than the pattern it replaces.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node, replace_with_new
from modelpress.ir.match import (
    attr,
    const_array,
    consumer_nodes,
    graph_opset,
    ints_arg,
    known_rank,
    other_input,
    sole_consumer,
)
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register


def _one(value: ir.Value | None) -> float | None:
    """A one-element constant of rank <= 1 (the pattern's operands all have rank >= 1)."""
    array = const_array(value)
    if array is None or array.size != 1 or array.ndim > 1 or array.dtype.kind not in "fiu":
        return None
    return float(array.reshape(()))


def _trailing_axes(node: ir.Node, rank: int | None) -> int | None:
    """k when ``node`` (a ReduceMean with keepdims=1) reduces exactly the last k axes."""
    if int(attr(node, "keepdims", 1)) != 1:
        return None
    given, axes = ints_arg(node, "axes", 1)
    if not given or not axes:
        return None
    if rank is not None:
        if any(not -rank <= a < rank for a in axes):
            return None
        axes = [a - rank if a >= 0 else a for a in axes]
    elif any(a >= 0 for a in axes):
        return None  # positive axes name trailing axes only if the rank is known
    k = len(axes)
    return k if sorted(axes) == list(range(-k, 0)) else None


def _fit(array: np.ndarray, norm_shape: tuple[int, ...] | None, k: int, rank: int | None):
    """``array`` (gamma or beta) as a tensor of the normalized shape, or None when multiplying or
    adding it would do more than scale or shift each normalized element."""
    if rank is not None and array.ndim > rank:
        return None  # the original Mul/Add would have raised the output's rank
    if any(d != 1 for d in array.shape[:-k]):
        return None  # it would vary along the axes that are not normalized
    tail = array.reshape(array.shape[-k:]) if array.ndim >= k else array
    padded = (1,) * (k - tail.ndim) + tail.shape
    if norm_shape is None:
        # Only gamma tells the normalized shape; a size-1 dim of gamma could stand for any size.
        if any(d == 1 for d in padded) or tail.ndim != k:
            return None
        norm_shape = padded
    if any(t not in (1, n) for t, n in zip(padded, norm_shape, strict=False)):
        return None
    return np.ascontiguousarray(np.broadcast_to(tail.reshape(padded), norm_shape))


@register
class FuseLayerNorm(GraphPass):
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] → LayerNormalization."""

    name = "fuse-layernorm"
    level = 2

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        if graph_opset(graph, self.model) < 17:
            return 0
        count = 0
        for node in list(graph):
            if node.graph is graph and node.op_type == "ReduceMean" and node.domain in ("", "ai.onnx"):
                count += self._try(graph, node)
        return count

    def _try(self, graph, mean: ir.Node) -> int:
        x = mean.inputs[0]
        rank = known_rank(x)
        k = _trailing_axes(mean, rank)
        if k is None:
            return 0
        sub = sole_consumer(mean.outputs[0], "Sub")
        if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
            return 0
        d = sub.outputs[0]
        if d.is_graph_output():
            return 0
        readers = consumer_nodes(d)
        if len(readers) != 2:  # the square and the division, nothing else
            return 0
        square = next((n for n in readers if self._is_square(n, d)), None)
        if square is None:
            return 0
        (divide,) = readers - {square}
        var = sole_consumer(square.outputs[0], "ReduceMean")
        if var is None or _trailing_axes(var, rank) != k:
            return 0
        add_eps = sole_consumer(var.outputs[0], "Add")
        eps = _one(other_input(add_eps, var.outputs[0])) if add_eps is not None else None
        if eps is None or eps < 0:
            return 0
        sqrt = sole_consumer(add_eps.outputs[0], "Sqrt")
        if sqrt is None:
            return 0
        nodes = [mean, sub, square, var, add_eps, sqrt]
        if divide.op_type == "Div" and divide.inputs[0] is d and divide.inputs[1] is sqrt.outputs[0]:
            if sole_consumer(sqrt.outputs[0], "Div") is not divide:
                return 0
        elif divide.op_type == "Mul":
            inverse = sole_consumer(sqrt.outputs[0], "Reciprocal", "Div")
            if inverse is None or (inverse.op_type == "Div" and (_one(inverse.inputs[0]) != 1.0 or inverse.inputs[1] is not sqrt.outputs[0])):
                return 0
            if sole_consumer(inverse.outputs[0], "Mul") is not divide or other_input(divide, d) is not inverse.outputs[0]:
                return 0
            nodes.append(inverse)
        else:
            return 0
        nodes.append(divide)
        out = divide.outputs[0]
        norm_shape = None
        if x.shape is not None and len(x.shape) >= k:
            dims = tuple(x.shape)[-k:]
            norm_shape = dims if all(isinstance(v, int) for v in dims) else None
        dtype = const_array(other_input(add_eps, var.outputs[0])).dtype  # Add's operands share x's dtype
        if dtype.kind != "f":
            return 0  # LayerNormalization is defined for floating types only
        scale = bias = None
        mul = sole_consumer(out, "Mul")
        gamma = const_array(other_input(mul, out)) if mul is not None else None
        if gamma is not None and gamma.dtype == dtype:
            scale = _fit(gamma, norm_shape, k, rank)
        if scale is not None:
            nodes.append(mul)
            out = mul.outputs[0]
            norm_shape = scale.shape
        add = sole_consumer(out, "Add")
        beta = const_array(other_input(add, out)) if add is not None else None
        if beta is not None and beta.dtype == dtype and norm_shape is not None:
            bias = _fit(beta, norm_shape, k, rank)
        if bias is not None:
            nodes.append(add)
            out = add.outputs[0]
        if scale is None:
            if norm_shape is None:
                return 0
            scale = np.ones(norm_shape, dtype)
        base = mean.name or "layernorm"
        inputs = [x, add_initializer(graph, scale, f"{base}_scale")]
        if bias is not None:
            inputs.append(add_initializer(graph, bias, f"{base}_bias"))
        ln = insert_node(
            graph, nodes[-1], "LayerNormalization", inputs, {"axis": -k, "epsilon": eps}, like=out
        )
        replace_with_new(out, ln.outputs[0])
        graph.remove(nodes, safe=True)
        return 1

    @staticmethod
    def _is_square(node: ir.Node, d: ir.Value) -> bool:
        if node.op_type == "Mul" and node.domain in ("", "ai.onnx"):
            return len(node.inputs) == 2 and node.inputs[0] is d and node.inputs[1] is d
        if node.op_type == "Pow" and node.domain in ("", "ai.onnx"):
            return node.inputs[0] is d and _one(node.inputs[1]) == 2.0
        return False

