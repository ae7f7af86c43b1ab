"""Graph statistics: op histogram, parameter count and bytes, inputs and outputs, opsets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir


def iter_nodes(graph: ir.Graph | ir.Function, *, recursive: bool = True) -> Iterator[ir.Node]:
    """Every node of ``graph``, and of its subgraphs (If/Loop/Scan bodies) when ``recursive``."""
    for node in graph:
        yield node
        if recursive:
            for sub in subgraphs(node):
                yield from iter_nodes(sub)


def iter_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and every subgraph inside it, outermost first."""
    yield graph
    for node in graph:
        for sub in subgraphs(node):
            yield from iter_graphs(sub)


def all_graphs(model: ir.Model) -> Iterator[ir.Graph]:
    """The main graph, the bodies of the model's functions, and every subgraph of either."""
    yield from iter_graphs(model.graph)
    for f in model.functions.values():
        yield from iter_graphs(f.graph)


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The graphs held by ``node``'s attributes (the bodies of If, Loop, Scan), in order."""
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def describe_value(value: ir.Value) -> dict:
    """Name, dtype and shape of a graph input or output (dynamic dims by name, unknown as '?')."""
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    if value.shape is None:
        shape = None
    else:
        shape = [d if isinstance(d, int) else (d.value or "?") for d in value.shape]
    return {"name": value.name, "dtype": dtype, "shape": shape}


@dataclass(frozen=True)
class GraphStats:
    inputs: list[dict]
    outputs: list[dict]
    opsets: dict[str, int]
    op_counts: dict[str, int]
    node_count: int  # Constant nodes not counted: they are data, not work
    constant_nodes: int
    parameters: int
    parameter_bytes: int
    subgraphs: int
    metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "opsets": self.opsets,
            "op_counts": self.op_counts,
            "node_count": self.node_count,
            "constant_nodes": self.constant_nodes,
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "subgraphs": self.subgraphs,
            "metadata": self.metadata,
        }


def _tensor_size(tensor: ir.TensorProtocol) -> tuple[int, int]:
    n = int(np.prod(tensor.shape.numpy())) if tensor.shape is not None else 0
    try:
        itemsize = tensor.dtype.itemsize
    except (AttributeError, TypeError, ValueError):
        itemsize = 0
    return n, int(n * itemsize)


def graph_stats(model: ir.Model) -> GraphStats:
    graph = model.graph
    ops: Counter[str] = Counter()
    constants = 0
    params = 0
    nbytes = 0
    for g in iter_graphs(graph):
        for init in g.initializers.values():
            if init.const_value is not None:
                n, b = _tensor_size(init.const_value)
                params += n
                nbytes += b
    for node in iter_nodes(graph):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if key == "Constant":
            constants += 1
            value = node.attributes.get("value")
            if value is not None and value.type == ir.AttributeType.TENSOR:
                n, b = _tensor_size(value.value)
                params += n
                nbytes += b
            continue
        ops[key] += 1
    subgraphs = sum(1 for _ in iter_graphs(graph)) - 1
    return GraphStats(
        inputs=[describe_value(v) for v in graph.inputs],
        outputs=[describe_value(v) for v in graph.outputs],
        opsets=dict(sorted(graph.opset_imports.items())),
        op_counts=dict(ops.most_common()),
        node_count=sum(ops.values()),
        constant_nodes=constants,
        parameters=params,
        parameter_bytes=nbytes,
        subgraphs=subgraphs,
        metadata=dict(model.metadata_props),
    )
