"""The primitive layer-normalization pattern → LayerNormalization (opset >= 17).

Old exporters (PyTorch at opset < 17, for instance) write ``nn.LayerNorm`` as::

    m = ReduceMean(x, axes)          d = Sub(x, m)          v = ReduceMean(Pow(d, 2) | Mul(d, d), axes)
    n = Div(d, Sqrt(Add(v, eps)))    [or Mul(d, Reciprocal(Sqrt(...))) / Mul(d, Div(1, Sqrt(...)))]
    y = Add(Mul(n, gamma), beta)     [gamma and beta optional, either operand order]

which is ``LayerNormalization(x, gamma, beta, axis=-k, epsilon=eps)`` when the ``axes`` are the k
trailing axes. ReduceMean's axes may be an attribute (opset < 18) or a constant input (>= 18).

The pattern (``matches``): both ReduceMeans reduce the same trailing axes with ``keepdims=1``, the
exponent 2 is a constant, and every intermediate has exactly the readers the pattern gives it
(``d`` is read by the square and the division, everything else once) and is no graph output.
Precondition (``check``): the model's opset is >= 17 (the pass never upgrades it;
``optimize(opset=17)`` does), ``eps`` is a non-negative constant and x is floating point; ``gamma``
and ``beta`` are taken in when they are constants that fit (else their Mul/Add stays after the
fusion). LayerNormalization needs a Scale of the normalized shape: it is taken from x's static
trailing dimensions when shape information has them, else from gamma's shape (then gamma must name
all k normalized dimensions; an x whose trailing size is 1 while gamma's is not would have been
broadcast by the original Mul, a degenerate case no exporter writes). Without gamma and without
static trailing dimensions the pattern is left alone. LayerNormalization computes in float32
(``stash_type=1``), which for float16 inputs is more precise than the pattern it replaces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

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
from modelpress.passes.rule import FusionPass


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


@dataclass
class _Match:
    x: ir.Value
    k: int  # the number of trailing axes normalized
    variance: ir.Value  # ReduceMean of the square
    add_eps: ir.Node
    nodes: list[ir.Node]  # mean, sub, square, var, add_eps, sqrt[, inverse], divide
    # derived by the check: the LayerNormalization's constants, and what it replaces
    eps: float = 0.0
    scale: np.ndarray | None = None
    bias: np.ndarray | None = None
    out: ir.Value | None = None


class FuseLayerNorm(FusionPass[_Match]):
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] → LayerNormalization."""

    name = "fuse-layernorm"
    ops = ("ReduceMean",)

    def matches(self, graph, mean: ir.Node) -> Iterator[_Match]:
        """The normalization ``(x - mean) / sqrt(var + eps)``, every intermediate read only by it."""
        x = mean.inputs[0]
        rank = known_rank(x)
        k = _trailing_axes(mean, rank)
        if k is None:
            return
        sub = sole_consumer(mean.outputs[0], "Sub")
        if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
            return
        d = sub.outputs[0]
        if d.is_graph_output():
            return
        readers = consumer_nodes(d)
        if len(readers) != 2:  # the square and the division, nothing else
            return
        square = next((n for n in readers if self._is_square(n, d)), None)
        if square is None:
            return
        (divide,) = readers - {square}
        var = sole_consumer(square.outputs[0], "ReduceMean")
        if var is None or _trailing_axes(var, rank) != k:
            return
        add_eps = sole_consumer(var.outputs[0], "Add")
        sqrt = sole_consumer(add_eps.outputs[0], "Sqrt") if add_eps is not None else None
        if sqrt is None:
            return
        nodes = [mean, sub, square, var, add_eps, sqrt]
        if (
            divide.op_type == "Div"
            and divide.inputs[0] is d
            and divide.inputs[1] is sqrt.outputs[0]
        ):
            if sole_consumer(sqrt.outputs[0], "Div") is not divide:
                return
        elif divide.op_type == "Mul":
            inverse = sole_consumer(sqrt.outputs[0], "Reciprocal", "Div")
            if inverse is None or (
                inverse.op_type == "Div"
                and (_one(inverse.inputs[0]) != 1.0 or inverse.inputs[1] is not sqrt.outputs[0])
            ):
                return
            if (
                sole_consumer(inverse.outputs[0], "Mul") is not divide
                or other_input(divide, d) is not inverse.outputs[0]
            ):
                return
            nodes.append(inverse)
        else:
            return
        nodes.append(divide)
        yield _Match(x, k, var.outputs[0], add_eps, nodes)

    def check(self, graph, m: _Match) -> str | None:
        opset = graph_opset(graph, self.model)
        if opset < 17:
            return f"opset {opset} has no LayerNormalization (from 17; optimize(opset=17) upgrades)"
        epsilon = other_input(m.add_eps, m.variance)
        eps = _one(epsilon)
        if eps is None or eps < 0:
            return "epsilon is not a non-negative one-element constant"
        dtype = const_array(epsilon).dtype  # Add's operands share x's dtype
        if dtype.kind != "f":
            return "LayerNormalization is defined for floating types only"
        x, k = m.x, m.k
        rank = known_rank(x)
        out = m.nodes[-1].outputs[0]
        norm_shape = None
        if x.shape is not None and len(x.shape) >= k:
            dims = tuple(x.shape)[-k:]
            norm_shape = dims if all(isinstance(v, int) for v in dims) else None
        # gamma and beta are optional: a Mul or Add that does not fit stays after the fusion
        scale = bias = None
        mul = sole_consumer(out, "Mul")
        gamma = const_array(other_input(mul, out)) if mul is not None else None
        if gamma is not None and gamma.dtype == dtype:
            scale = _fit(gamma, norm_shape, k, rank)
        nodes = list(m.nodes)
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
                return "no gamma and no static normalized dimensions to shape LayerNormalization's Scale"
            scale = np.ones(norm_shape, dtype)
        m.eps, m.scale, m.bias, m.out, m.nodes = eps, scale, bias, out, nodes
        return None

    def rewrite(self, graph, m: _Match) -> int:
        base = m.nodes[0].name or "layernorm"
        inputs = [m.x, add_initializer(graph, m.scale, f"{base}_scale")]
        if m.bias is not None:
            inputs.append(add_initializer(graph, m.bias, f"{base}_bias"))
        ln = insert_node(
            graph,
            m.nodes[-1],
            "LayerNormalization",
            inputs,
            {"axis": -m.k, "epsilon": m.eps},
            like=m.out,
        )
        replace_with_new(m.out, ln.outputs[0])
        graph.remove(m.nodes, safe=True)
        return 1

    @staticmethod
    def _is_square(node: ir.Node, d: ir.Value) -> bool:
        if node.op_type == "Mul" and node.domain in ("", "ai.onnx"):
            return len(node.inputs) == 2 and node.inputs[0] is d and node.inputs[1] is d
        if node.op_type == "Pow" and node.domain in ("", "ai.onnx"):
            return node.inputs[0] is d and _one(node.inputs[1]) == 2.0
        return False
