"""Editing a graph: unique names, new initializers and nodes, replacing and removing values,
copies. Every rewrite in modelpress goes through these."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir

from modelpress.ir.io import from_proto, to_proto


def add_initializer(graph: ir.Graph | ir.Function, array: np.ndarray, name_hint: str) -> ir.Value:
    """A new constant value holding ``array``: an initializer of ``graph`` (unique name).

    Functions have no initializers, so there the constant becomes a Constant node prepended.
    """
    if isinstance(graph, ir.Function):
        node = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name_hint)})
        graph.insert_before(next(iter(graph)), node) if len(graph) else graph.append(node)
        node.outputs[0].name = unique_name(graph, name_hint)
        return node.outputs[0]
    name = unique_name(graph, name_hint)
    value = ir.Value(
        name=name,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value


# Graphs under a bulk edit (``bulk_names``) → every name taken in them, kept up to date.
_TAKEN: dict[int, set[str]] = {}


@contextmanager
def bulk_names(graph: ir.Graph) -> Iterator[None]:
    """Within the block, the names taken in ``graph`` are collected once instead of at every new
    constant (which is quadratic in the graph's size: a minute on DenseNet-121's int8 rewrite).
    Names the block gives by hand, outside ``add_initializer``, must go through ``reserve``."""
    if id(graph) in _TAKEN:
        yield
        return
    _TAKEN[id(graph)] = _collect_names(graph)
    try:
        yield
    finally:
        del _TAKEN[id(graph)]


def taken_names(graph: ir.Graph | ir.Function) -> set[str]:
    """Value and node names in use (the live set, under ``bulk_names``)."""
    live = _TAKEN.get(id(graph))
    return live if live is not None else _collect_names(graph)


def reserve(graph: ir.Graph | ir.Function, *names: str) -> None:
    """Record names given by hand during a ``bulk_names`` block."""
    live = _TAKEN.get(id(graph))
    if live is not None:
        live.update(names)


def _collect_names(graph: ir.Graph | ir.Function) -> set[str]:
    taken = set(graph.initializers) if isinstance(graph, ir.Graph) else set()
    taken.update(v.name for v in graph.inputs)
    for node in graph:
        taken.add(node.name)
        taken.update(o.name for o in node.outputs)
    return taken


def unique_name(graph: ir.Graph | ir.Function, hint: str) -> str:
    """``hint``, or ``hint_k``: a name no value or node of ``graph`` has (and now reserved)."""
    taken = taken_names(graph)
    name, i = hint, 1
    while name in taken:
        name = f"{hint}_{i}"
        i += 1
    reserve(graph, name)
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
        graph = old.producer().graph if old.producer() is not None else old.graph
        producer = new.producer()
        # The new value must be computed inside the same graph: a subgraph may not return an outer
        # value directly (ONNX Runtime rejects it), and renaming an outer value would break it.
        if (
            new.is_graph_input()
            or new.is_graph_output()
            or new.is_initializer()
            or producer is None
            or producer.graph is not graph
        ):
            return False
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


def replace_with_new(old: ir.Value, new: ir.Value) -> None:
    """``replace_value(old, new)`` for a ``new`` made by a freshly inserted node, which also takes
    ``old``'s name. onnx_ir names new values per graph ("val_0", ...), so a value made in a
    subgraph could otherwise share its name with one of the outer graph, which breaks SSA."""
    name = old.name
    replace_value(old, new)
    if name and new.name != name:
        old.name = None
        new.name = name


def remove_node(graph: ir.Graph | ir.Function, node: ir.Node) -> None:
    """Remove ``node`` once nothing uses its outputs (safe: detaches its inputs first)."""
    graph.remove(node, safe=True)


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


def make_slice(
    graph: ir.Graph | ir.Function,
    before: ir.Node,
    data: ir.Value,
    params: tuple[list[int], list[int], list[int], list[int]],
    *,
    opset: int,
    like: ir.Value | None = None,
    name_hint: str = "slice",
) -> ir.Node:
    """A Slice of ``data`` in the form ``opset`` wants (attributes before 10, inputs from 10).

    ``name_hint`` prefixes the parameter initializers' names; derive it from a name unique in the
    model, since a subgraph's initializer must not repeat a name of an enclosing graph.
    """
    starts, ends, axes, steps = params
    if opset < 10:
        assert all(s == 1 for s in steps), "Slice before opset 10 has no steps"
        return insert_node(
            graph,
            before,
            "Slice",
            [data],
            {"starts": starts, "ends": ends, "axes": axes},
            like=like,
        )
    arrays = [np.array(v, dtype=np.int64) for v in (starts, ends, axes, steps)]
    names = [f"{name_hint}_{part}" for part in ("starts", "ends", "axes", "steps")]
    inputs = [add_initializer(graph, a, n) for a, n in zip(arrays, names)]
    return insert_node(graph, before, "Slice", [data, *inputs], like=like)


def copy_model(model: ir.Model) -> ir.Model:
    """A deep copy (through the serialized form: onnx_ir values cannot belong to two graphs)."""
    return from_proto(to_proto(model))


def remove_unused_initializers(graph: ir.Graph) -> int:
    """Drop initializers nothing reads (the float weights a quantized copy replaced)."""
    unused = [
        name
        for name, v in graph.initializers.items()
        if not v.uses() and not v.is_graph_output() and not v.is_graph_input()
    ]
    for name in unused:
        del graph.initializers[name]
    return len(unused)


def swap_node(graph: ir.Graph, node: ir.Node, new_nodes: list[ir.Node], result: ir.Value) -> None:
    """Replace ``node`` (one output) by ``new_nodes``, placed where it was, whose ``result``
    takes over the output: its readers, its type and shape, and its name (so reports and graph
    outputs match the float model's tensors)."""
    old = node.outputs[0]
    result.type, result.shape = old.type, old.shape
    name = old.name
    graph.insert_after(node, new_nodes)
    replace_value(old, result)
    graph.remove(node, safe=True)
    result.name = name
