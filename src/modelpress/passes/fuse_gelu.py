"""GELU and hard-swish written with primitive ops → the standard ``Gelu`` / ``HardSwish`` op.

GELU, exact (``Gelu``, approximate="none", opset >= 20)::

    0.5 · x · (1 + Erf(x / √2))          x / √2 as Div(x, 1.41421...) or Mul(x, 0.70710...)

GELU, tanh approximation (``Gelu``, approximate="tanh", opset >= 20)::

    0.5 · x · (1 + Tanh(√(2/π) · (x + 0.044715 · x³)))     x³ as Pow(x, 3), Mul(Mul(x, x), x)
                                                            or Mul(x, Mul(x, x))

The outer product is matched in each arrangement exporters write: ``(x·a)·0.5``, ``(x·a)/2``,
``(x·0.5)·a``, ``(a·0.5)·x``, any operand order. Hard-swish (``HardSwish``, opset >= 14)::

    x · HardSigmoid(x; alpha=1/6, beta=0.5)      or      x · Clip(x + 3, 0, 6) / 6
                                                        (÷6 or ×1/6, before or after the ×x)

``x · Sigmoid(x)`` (swish/SiLU) is left as it is: ONNX has no standard op for it.

The pattern (``matches``) holds only when every constant matches its value within a relative 1e-5
(so 0.7071 and 1.4142 are accepted, their error is below fp32 tolerance of the result) and is a
scalar or a one-element tensor that does not broadcast x to a higher rank, and every intermediate
is read only inside the pattern, once, and is no graph output. Precondition (``check``): the
model's opset has the op (the pass never upgrades it; ``optimize(opset=20)`` does) and the whole
pattern lives in the graph being rewritten. A GELU in float16 computed by ``Gelu`` rounds less
often than the pattern did: the results agree within float16 tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import insert_node, replace_with_new
from modelpress.ir.match import (
    attr,
    const_array,
    const_scalar,
    graph_opset,
    in_graph,
    is_close,
    is_single_use,
    other_input,
    producer_of,
    sole_consumer,
)
from modelpress.passes.rule import FusionPass

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# ONNX's own function bodies (Gelu, HardSwish) add with a two-input Sum; other_input() refuses
# any other arity, so Sum matches only where it is an Add.
_ADD = ("Add", "Sum")


def _const_operand(node: ir.Node, value: ir.Value, expected: float, x: ir.Value) -> bool:
    """Whether binary ``node`` combines ``value`` with a float constant equal to ``expected``.

    Float only: with integer operands Div truncates and Gelu/HardSwish are not defined."""
    other = other_input(node, value)
    array = const_array(other)
    return (
        array is not None
        and array.dtype.kind == "f"
        and is_close(const_scalar(other, other=x), expected)
    )


def _scaled_by(node: ir.Node | None, value: ir.Value, factor: float, x: ir.Value) -> bool:
    """Whether ``node`` computes ``value · factor`` (as Mul by factor or Div by 1/factor)."""
    if node is None or len(node.inputs) != 2:
        return False
    if node.op_type == "Mul":
        return _const_operand(node, value, factor, x)
    if node.op_type == "Div":
        return node.inputs[0] is value and _const_operand(node, value, 1.0 / factor, x)
    return False


def _scaled_input(value: ir.Value, factor: float) -> tuple[ir.Value, ir.Node] | None:
    """``(x, node)`` when ``value`` is made by ``node`` as ``x · factor`` and read only once."""
    node = producer_of(value, "Mul", "Div")
    if node is None or not is_single_use(value):
        return None
    for x in (node.inputs[0],) if node.op_type == "Div" else tuple(node.inputs):
        if x is not None and _scaled_by(node, x, factor, x):
            return x, node
    return None


def _one_plus(value: ir.Value, x: ir.Value) -> ir.Node | None:
    """The Add reading ``value`` (only) that computes ``1 + value``."""
    add = sole_consumer(value, *_ADD)
    return add if add is not None and _const_operand(add, value, 1.0, x) else None


def _half_product(a: ir.Value, x: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """Match ``0.5 · x · a``: the value computed and the nodes computing it."""
    m1 = sole_consumer(a, "Mul")
    if m1 is None:
        return None
    other = other_input(m1, a)
    if other is x:  # (x·a)·0.5 or (x·a)/2
        m2 = sole_consumer(m1.outputs[0], "Mul", "Div")
        if _scaled_by(m2, m1.outputs[0], 0.5, x):
            return m2.outputs[0], [m1, m2]
        return None
    if _const_operand(m1, a, 0.5, x):  # (a·0.5)·x
        m2 = sole_consumer(m1.outputs[0], "Mul")
        if m2 is not None and other_input(m2, m1.outputs[0]) is x:
            return m2.outputs[0], [m1, m2]
        return None
    half = _scaled_input(other, 0.5) if other is not None else None  # (x·0.5)·a
    if half is not None and half[0] is x:
        return m1.outputs[0], [half[1], m1]
    return None


def _cube_of(value: ir.Value, x: ir.Value) -> list[ir.Node] | None:
    """The nodes computing ``value = x³`` (read once), else None."""
    if not is_single_use(value):
        return None
    pow_node = producer_of(value, "Pow")
    if pow_node is not None:
        return (
            [pow_node]
            if pow_node.inputs[0] is x and is_close(const_scalar(pow_node.inputs[1], other=x), 3.0)
            else None
        )
    mul = producer_of(value, "Mul")
    if mul is None:
        return None
    square = other_input(mul, x)
    sq_node = producer_of(square, "Mul") if square is not None else None
    if sq_node is not None and is_single_use(square) and list(sq_node.inputs) == [x, x]:
        return [sq_node, mul]
    return None


def _match_erf(erf: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    scaled = _scaled_input(erf.inputs[0], 1.0 / SQRT2)
    if scaled is None:
        return None
    x, scale = scaled
    add = _one_plus(erf.outputs[0], x)
    tail = _half_product(add.outputs[0], x) if add is not None else None
    if tail is None:
        return None
    return x, tail[0], [scale, erf, add, *tail[1]]


def _match_tanh(tanh: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    outer = producer_of(tanh.inputs[0], "Mul")
    if outer is None or not is_single_use(tanh.inputs[0]):
        return None
    for inner in outer.inputs:
        add_in = producer_of(inner, *_ADD)
        if (
            add_in is None
            or len(add_in.inputs) != 2
            or not is_single_use(inner)
            or not _const_operand(outer, inner, SQRT_2_OVER_PI, inner)
        ):
            continue
        for x, term in (tuple(add_in.inputs), tuple(reversed(add_in.inputs))):
            coef = producer_of(term, "Mul")
            if coef is None or not is_single_use(term):
                continue
            for cube in coef.inputs:
                cube_nodes = _cube_of(cube, x) if _const_operand(coef, cube, 0.044715, x) else None
                if cube_nodes is None:
                    continue
                add = _one_plus(tanh.outputs[0], x)
                tail = _half_product(add.outputs[0], x) if add is not None else None
                if tail is not None:
                    return x, tail[0], [*cube_nodes, coef, add_in, outer, tanh, add, *tail[1]]
    return None


def _clip_bounds(clip: ir.Node) -> tuple[float | None, float | None]:
    if clip.attributes.get("min") is not None or clip.attributes.get("max") is not None:
        return attr(clip, "min"), attr(clip, "max")  # opset < 11
    bounds = [
        const_scalar(clip.inputs[i])
        if len(clip.inputs) > i and clip.inputs[i] is not None
        else None
        for i in (1, 2)
    ]
    return bounds[0], bounds[1]


def _match_relu6_swish(clip: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    low, high = _clip_bounds(clip)
    if low != 0.0 or high != 6.0:
        return None
    shift = producer_of(clip.inputs[0], *_ADD)
    if shift is None or not is_single_use(clip.inputs[0]):
        return None
    c = clip.outputs[0]
    for x in shift.inputs:
        if x is None or not _const_operand(shift, x, 3.0, x):
            continue
        first = sole_consumer(c, "Mul", "Div")
        if first is None:
            return None
        if other_input(first, c) is x and first.op_type == "Mul":  # (x · clip) / 6
            second = sole_consumer(first.outputs[0], "Mul", "Div")
            if _scaled_by(second, first.outputs[0], 1.0 / 6.0, x):
                return x, second.outputs[0], [shift, clip, first, second]
        elif _scaled_by(first, c, 1.0 / 6.0, x):  # x · (clip / 6)
            second = sole_consumer(first.outputs[0], "Mul")
            if second is not None and other_input(second, first.outputs[0]) is x:
                return x, second.outputs[0], [shift, clip, first, second]
    return None


def _match_hardsigmoid_swish(hs: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    if not (
        is_close(float(attr(hs, "alpha", 0.2)), 1.0 / 6.0)
        and is_close(float(attr(hs, "beta", 0.5)), 0.5)
    ):
        return None
    x = hs.inputs[0]
    mul = sole_consumer(hs.outputs[0], "Mul")
    if mul is None or other_input(mul, hs.outputs[0]) is not x:
        return None
    return x, mul.outputs[0], [hs, mul]


# anchor op → (matcher, replacement op, its attributes, first opset that has it)
_RULES = {
    "Erf": (_match_erf, "Gelu", {}, 20),
    "Tanh": (_match_tanh, "Gelu", {"approximate": "tanh"}, 20),
    "Clip": (_match_relu6_swish, "HardSwish", {}, 14),
    "HardSigmoid": (_match_hardsigmoid_swish, "HardSwish", {}, 14),
}


@dataclass
class _Match:
    x: ir.Value
    out: ir.Value  # the pattern's result
    nodes: list[ir.Node]  # every node of the pattern
    op_type: str  # the replacement
    attributes: dict
    since: int  # the first opset that has it


class FuseGelu(FusionPass[_Match]):
    """Erf/Tanh GELU patterns → Gelu (opset >= 20); x·HardSigmoid(x), x·Relu6(x+3)/6 → HardSwish (>= 14)."""

    name = "fuse-gelu"
    ops = tuple(_RULES)

    def matches(self, graph, node: ir.Node) -> Iterator[_Match]:
        matcher, op_type, attributes, since = _RULES[node.op_type]
        found = matcher(node)
        if found is not None:
            yield _Match(*found, op_type, attributes, since)

    def check(self, graph, m: _Match) -> str | None:
        opset = graph_opset(graph, self.model)
        if opset < m.since:
            return f"opset {opset} has no {m.op_type} (from {m.since}; optimize(opset={m.since}) upgrades)"
        # Every node of the match must live in this graph (a subgraph may read outer values).
        if any(not in_graph(n, graph) for n in m.nodes):
            return "part of the pattern belongs to an enclosing graph"
        return None

    def rewrite(self, graph, m: _Match) -> int:
        # Right before the node making the result: every other matched node feeds it, so x and
        # the pattern's constants are all defined by then.
        fused = insert_node(
            graph, m.out.producer(), m.op_type, [m.x], dict(m.attributes), like=m.out
        )
        replace_with_new(m.out, fused.outputs[0])
        graph.remove(m.nodes, safe=True)
        return 1
