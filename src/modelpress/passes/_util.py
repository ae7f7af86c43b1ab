"""Small helpers shared by the passes: constants, value replacement, node creation."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node) as numpy, else None.

    Graph inputs that double as initializers are not constants: the caller may override them.
    """
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # noqa: BLE001 - string or exotic tensors are not foldable here
        return None


def is_single_use(value: ir.Value) -> bool:
    """True when exactly one node consumes ``value`` and it is not a graph output."""
    return len(value.uses()) == 1 and not value.is_graph_output()


def add_initializer(graph: ir.Graph | ir.Function, array: np.ndarray, name_hint: str) -> ir.Value:
    """A new constant value holding ``array``: an initializer of ``graph`` (unique name).

    Functions have no initializers, so there the constant becomes a Constant node prepended.
    """
    if isinstance(graph, ir.Function):
        node = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name_hint)})
        graph.insert_before(next(iter(graph)), node) if len(graph) else graph.append(node)
        node.outputs[0].name = _unique(graph, name_hint)
        return node.outputs[0]
    name = _unique(graph, name_hint)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def _unique(graph, hint: str) -> str:
    taken = set()
    if isinstance(graph, ir.Graph):
        taken |= set(graph.initializers)
    for v in graph.inputs:
        taken.add(v.name)
    for node in graph:
        for o in node.outputs:
            taken.add(o.name)
    name, i = hint, 1
    while name in taken:
        name = f"{hint}_{i}"
        i += 1
    return name


def replace_value(old: ir.Value, new: ir.Value) -> bool:
    """Make every consumer of ``old`` (and the graph output it may be) use ``new`` instead.

    When ``old`` is a graph output, ``new`` takes its place in the output list and its name, so the
    model's interface is unchanged. That is impossible when ``new`` is itself a graph input, output
    or initializer (its name is fixed); then nothing changes and False is returned.
    """
    if old is new:
        return False
    if old.is_graph_output():
        if new.is_graph_input() or new.is_graph_output() or new.is_initializer() or new.producer() is None:
            return False
        graph = old.graph
        name = old.name
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
        old.name = None
        new.name = name
        if new.type is None:
            new.type = old.type
        if new.shape is None:
            new.shape = old.shape
    ir.convenience.replace_all_uses_with(old, new)
    return True


def remove_node(graph: ir.Graph | ir.Function, node: ir.Node) -> None:
    """Remove ``node`` once nothing uses its outputs (safe: detaches its inputs first)."""
    graph.remove(node, safe=True)


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


def insert_node(
    graph: ir.Graph | ir.Function,
    before: ir.Node,
    op_type: str,
    inputs: list[ir.Value | None],
    attributes: dict | None = None,
    *,
    like: ir.Value | None = None,
) -> ir.Node:
    """A new standard-domain node inserted before ``before`` (keeps the order topological).

    ``like``: a value the new node's (first) output is known to equal in dtype and shape.
    """
    node = ir.node(op_type, inputs, attributes=attributes or {})
    graph.insert_before(before, node)
    if like is not None:
        node.outputs[0].type = like.type
        node.outputs[0].shape = like.shape
    return node


# --- pattern-matching helpers (used by the fusion passes) ---


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
