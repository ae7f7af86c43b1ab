"""Reading a graph: constants behind values, the shape of a match (producers, consumers,
operands), and node attributes in either of their opset forms."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

# Op families that several layers (costs, channel analysis, pruning rules, decoys) read alike.
#: The reductions over the axes they are given (every axis by default); the pools over every
#: spatial axis.
REDUCTIONS = (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")
#: Ops that combine their inputs element by element, numpy-style broadcasting: arithmetic (binary
#: and variadic), comparisons, logic, Where.
ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean")
COMPARISONS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")
BROADCASTING = (*ARITHMETIC, "Where", "PRelu", *COMPARISONS, "And", "Or", "Xor", "Mod", "BitShift")


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node) as numpy, else None.

    Graph inputs that double as initializers are not constants: the caller may override them.
    """
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if (
            producer is None
            or producer.op_type != "Constant"
            or producer.domain not in ("", "ai.onnx")
        ):
            return None
        # Read the common `value` attribute directly: get_const_tensor's protocol isinstance checks
        # cost ~4x more and dominated pattern-matching passes on models with many Constant nodes.
        attr = producer.attributes.get("value")
        tensor = (
            attr.value
            if attr is not None and attr.type == ir.AttributeType.TENSOR
            else ir.convenience.get_const_tensor(value)
        )
        if tensor is None:
            return None
    try:
        return tensor.numpy()
    except Exception:  # noqa: BLE001 - string or exotic tensors are not foldable here
        return None


def is_single_use(value: ir.Value) -> bool:
    """True when exactly one node consumes ``value`` and it is not a graph output."""
    return len(value.uses()) == 1 and not value.is_graph_output()


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The shape of ``value`` when every dimension is a known integer, else None."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    if not all(isinstance(d, int) for d in dims):
        return None
    return dims


def known_rank(value: ir.Value | None) -> int | None:
    """The rank of ``value`` when its shape is known (dimensions may be symbolic), else None."""
    if value is None or value.shape is None:
        return None
    return value.shape.rank()


def ints_arg(node: ir.Node, name: str, index: int) -> tuple[bool, list[int] | None]:
    """An integer list that older opsets give as attribute ``name`` and newer ones as input ``index``.

    Returns ``(given, values)``: ``given`` is False when neither form is present (the op's default
    applies); ``values`` is None when it is given as an input that is not a constant.
    """
    attr = node.attributes.get(name)
    if attr is not None:
        return True, [int(v) for v in attr.as_ints()]
    if index < len(node.inputs) and node.inputs[index] is not None:
        array = const_array(node.inputs[index])
        if array is None or array.dtype.kind not in "iu":
            return True, None
        return True, [int(v) for v in array.reshape(-1)]
    return False, None


def producer_of(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The node producing ``value`` when it is one of ``op_types`` in the standard domain."""
    node = value.producer() if value is not None else None
    if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in op_types:
        return None
    return node


def sole_consumer(value: ir.Value, *op_types: str) -> ir.Node | None:
    """The one node that reads ``value`` (once), if it is one of ``op_types`` and ``value`` is no
    graph output; else None. A fusion that swallows ``value`` needs exactly this."""
    if not is_single_use(value):
        return None
    node = value.uses()[0].node
    if node.domain not in ("", "ai.onnx") or node.op_type not in op_types:
        return None
    return node


def consumer_nodes(value: ir.Value) -> set[ir.Node]:
    """The distinct nodes that read ``value``."""
    return {use.node for use in value.uses()}


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """For a binary node that reads ``value`` once, its other operand (either position)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a is value and b is not value:
        return b
    if b is value and a is not value:
        return a
    return None


def const_scalar(value: ir.Value | None, *, other: ir.Value | None = None) -> float | None:
    """The float of a one-element constant, else None.

    A one-element constant of rank r only leaves an elementwise op's output shape unchanged when
    the other operand has rank >= r; when ``other`` is given that is checked (rank 0 always is).
    """
    array = const_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    if array.ndim > 0:
        if other is None or other.shape is None or len(other.shape) < array.ndim:
            return None
    return float(array.reshape(()))


def is_close(a: float | None, b: float, rel: float = 1e-5) -> bool:
    """Tolerant comparison of a matched constant with the value a pattern needs."""
    return a is not None and abs(a - b) <= rel * abs(b) + 1e-12


def attr(node: ir.Node, name: str, default=None):
    """An attribute's Python value, or ``default`` when the node does not set it."""
    a = node.attributes.get(name)
    return default if a is None else a.value


def slice_params(node: ir.Node) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """``(starts, ends, axes, steps)`` of a Slice whose parameters are all constant, else None.

    Reads both forms: attributes before opset 10, inputs from 10 (missing axes and steps take
    their defaults: the first ``len(starts)`` axes, step 1).
    """
    if "starts" in node.attributes:
        starts = [int(v) for v in node.attributes["starts"].as_ints()]
        ends = [int(v) for v in node.attributes["ends"].as_ints()]
        axes = node.attributes.get_ints("axes", None)
        steps = None
    else:
        arrays = [const_array(v) if v is not None else None for v in list(node.inputs[1:5])]
        arrays += [None] * (4 - len(arrays))
        if arrays[0] is None or arrays[1] is None:
            return None
        for i in (2, 3):  # an optional input that is given but not constant
            if arrays[i] is None and len(node.inputs) > i + 1 and node.inputs[i + 1] is not None:
                return None
        starts, ends, axes, steps = (
            None if a is None else [int(v) for v in a.reshape(-1)] for a in arrays
        )
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not (len(starts) == len(ends) == len(axes) == len(steps)) or 0 in steps:
        return None
    return starts, ends, axes, steps


def in_graph(node: ir.Node | None, graph: ir.Graph | ir.Function) -> bool:
    """True when ``node`` belongs to ``graph`` itself (not to an enclosing graph, nor removed).

    A function's nodes report the function's underlying ``ir.Graph`` as theirs.
    """
    owner = graph.graph if isinstance(graph, ir.Function) else graph
    return node is not None and node.graph is owner


def can_become_output_of(value: ir.Value, graph: ir.Graph | ir.Function) -> bool:
    """Whether ``value`` may stand in for an output of ``graph`` (via ``replace_value``).

    A subgraph must not return a value of an enclosing graph directly (ONNX Runtime rejects the
    model: "an outer scope value being returned directly"), and taking the output's name would
    rename that outer value. So the value must be computed by a node of ``graph`` itself.
    """
    return in_graph(value.producer(), graph)


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    out: dict[str, ir.Value] = {v.name: v for v in graph.inputs if v.name}
    out.update({k: v for k, v in graph.initializers.items()})
    for node in graph:
        for v in node.outputs:
            if v.name:
                out[v.name] = v
    return out


def graph_opset(graph: ir.Graph | ir.Function, model: ir.Model, domain: str = "") -> int:
    """The opset version of ``domain`` that applies inside ``graph`` (a function may import its own)."""
    if isinstance(graph, ir.Function) and domain in graph.opset_imports:
        return graph.opset_imports[domain]
    return model.opset_imports.get(domain, 0)
