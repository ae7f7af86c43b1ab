"""Helpers shared by the tests: models from ONNX text format, graphs compared with an expected one
written as ONNX text, and the reasons a pass gives for the matches it refuses.

Tests import this module by name (``from mp_testing import model_from_text``); pyproject puts
``tests/`` on the path. It is not a conftest so that per-folder conftest files cannot shadow it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir

from modelpress.ir import from_proto, parse, to_proto


def model_from_text(text: str) -> ir.Model:
    """An ``onnx_ir.Model`` from ONNX text format (checked by the ONNX checker)."""
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    return from_proto(proto)


_TEXT_DTYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "float16",
    "int64": "int64",
    "int32": "int32",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


def lit(array) -> str:
    """The values of ``array`` as an ONNX text literal: ``{1.0,2.5}``."""
    values = np.ravel(np.asarray(array))
    if values.dtype.kind == "f":
        return "{" + ",".join(repr(float(v)) for v in values) + "}"
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def init(name: str, array, dtype=None) -> str:
    """An initializer in ONNX text, ``float[3,1,1] name = {...}``: ``array`` cast to ``dtype``
    (default: float32 for floats, the array's own dtype otherwise)."""
    a = np.asarray(array)
    a = a.astype(dtype if dtype is not None else (np.float32 if a.dtype.kind == "f" else a.dtype))
    dims = f"[{','.join(map(str, a.shape))}]" if a.ndim else ""
    return f"{_TEXT_DTYPES[a.dtype.name]}{dims} {name} = {lit(a)}"


def node_ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def structure(model) -> list[tuple]:
    """Each node as (op, inputs), inputs named by graph input, 'const', or (producer index, slot)."""
    graph = model.graph
    index = {node: i for i, node in enumerate(graph)}
    consts = set(graph.initializers.values())

    def ref(v):
        if v is None:
            return None
        if v in consts:
            return "const"
        if v.producer() is None:
            return v.name
        return (index[v.producer()], v.index())

    return [(n.op_type, [ref(v) for v in n.inputs]) for n in graph] + [
        ("out", [ref(v) for v in graph.outputs])
    ]


# --- expected graphs -------------------------------------------------------------------------


def _inner_values(graph: ir.Graph) -> set[ir.Value]:
    """Every value defined inside ``graph`` or its subgraphs (inputs, initializers, node outputs)."""
    values: set[ir.Value] = set(graph.inputs) | set(graph.initializers.values())
    for node in graph:
        values.update(node.outputs)
        for sub in _subgraphs(node):
            values |= _inner_values(sub)
    return values


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for a in node.attributes.values():
        if a.is_ref():
            continue
        if a.type == ir.AttributeType.GRAPH:
            yield a.as_graph()
        elif a.type == ir.AttributeType.GRAPHS:
            yield from a.as_graphs()


def _reads(node: ir.Node) -> list[ir.Value]:
    """What ``node`` reads: its inputs, then the outer values its subgraphs capture."""
    reads = [v for v in node.inputs if v is not None]
    for sub in _subgraphs(node):
        inner = _inner_values(sub)
        stack = [sub]
        while stack:
            g = stack.pop()
            for n in g:
                reads.extend(v for v in n.inputs if v is not None and v not in inner)
                stack.extend(_subgraphs(n))
    return reads


def canonical_order(graph: ir.Graph) -> list[ir.Node]:
    """The nodes in a topological order that depends on how values connect, not on how the nodes
    happen to be listed: depth-first from the graph outputs in order, a node after everything it
    reads (inputs in order, then what its subgraphs capture); nodes no output needs come last, in
    the same order from each of them."""
    order: list[ir.Node] = []
    seen: set[ir.Node] = set()

    def visit(root: ir.Node) -> None:
        if root in seen:
            return
        seen.add(root)
        stack = [(root, iter(_reads(root)))]
        while stack:
            node, reads = stack[-1]
            for v in reads:
                producer = v.producer()
                if producer is not None and producer.graph is graph and producer not in seen:
                    seen.add(producer)
                    stack.append((producer, iter(_reads(producer))))
                    break
            else:
                stack.pop()
                order.append(node)

    for v in graph.outputs:
        if v.producer() is not None and v.producer().graph is graph:
            visit(v.producer())
    for node in graph:
        visit(node)
    return order


class _Compare:
    """Walks an actual and an expected graph side by side, mapping actual values to expected ones."""

    def __init__(self, rtol: float, atol: float):
        self.rtol, self.atol = rtol, atol
        self.values: dict[ir.Value, ir.Value] = {}

    def fail(self, where: str, what: str) -> None:
        raise AssertionError(f"{where}: {what}")

    def graph(self, a: ir.Graph, e: ir.Graph, where: str, *, interface: bool) -> None:
        """``interface``: the graph inputs' and outputs' names and types must match too."""
        for kind, xs, ys in (("input", a.inputs, e.inputs), ("output", a.outputs, e.outputs)):
            if len(xs) != len(ys):
                self.fail(where, f"{len(xs)} graph {kind}s, expected {len(ys)}")
            if interface:
                for x, y in zip(xs, ys):
                    if (
                        x.name != y.name
                        or str(x.type) != str(y.type)
                        or str(x.shape) != str(y.shape)
                    ):
                        self.fail(
                            where,
                            f"graph {kind} {x.name}: {x.type} {x.shape}, expected {y.name}: {y.type} {y.shape}",
                        )
        if len(a.initializers) != len(e.initializers):
            self.fail(where, f"{len(a.initializers)} initializers, expected {len(e.initializers)}")
        self.values.update(zip(a.inputs, e.inputs))
        na, ne = canonical_order(a), canonical_order(e)
        ops_a, ops_e = [n.op_type for n in na], [n.op_type for n in ne]
        if ops_a != ops_e:
            self.fail(where, f"ops {ops_a}, expected {ops_e}")
        for i, (x, y) in enumerate(zip(na, ne)):
            self.node(x, y, f"{where}, node {i} ({x.op_type})")
        for i, (x, y) in enumerate(zip(a.outputs, e.outputs)):
            self.value(x, y, f"{where}, graph output {i}")

    def node(self, a: ir.Node, e: ir.Node, where: str) -> None:
        if a.domain != e.domain:
            self.fail(where, f"domain {a.domain!r}, expected {e.domain!r}")
        if sorted(a.attributes) != sorted(e.attributes):
            self.fail(where, f"attributes {sorted(a.attributes)}, expected {sorted(e.attributes)}")
        for name in a.attributes:
            self.attribute(a.attributes[name], e.attributes[name], f"{where}, attribute {name}")
        if len(a.inputs) != len(e.inputs) or len(a.outputs) != len(e.outputs):
            self.fail(
                where,
                f"{len(a.inputs)} inputs and {len(a.outputs)} outputs, expected {len(e.inputs)} and {len(e.outputs)}",
            )
        for i, (x, y) in enumerate(zip(a.inputs, e.inputs)):
            self.value(x, y, f"{where}, input {i}")
        self.values.update(zip(a.outputs, e.outputs))

    def attribute(self, a: ir.Attr, e: ir.Attr, where: str) -> None:
        if a.is_ref() or e.is_ref():
            if not (a.is_ref() and e.is_ref() and a.ref_attr_name == e.ref_attr_name):
                self.fail(where, "references differ")
            return
        if a.type != e.type:
            self.fail(where, f"type {a.type.name}, expected {e.type.name}")
        if a.type == ir.AttributeType.GRAPH:
            self.graph(a.as_graph(), e.as_graph(), where, interface=False)
        elif a.type == ir.AttributeType.GRAPHS:
            for x, y in zip(a.as_graphs(), e.as_graphs(), strict=True):
                self.graph(x, y, where, interface=False)
        elif a.type == ir.AttributeType.TENSOR:
            self.array(a.as_tensor().numpy(), e.as_tensor().numpy(), where)
        elif a.type in (ir.AttributeType.FLOAT, ir.AttributeType.FLOATS):
            self.array(np.asarray(a.value, np.float64), np.asarray(e.value, np.float64), where)
        elif a.type in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
            if list(a.value) != list(e.value):
                self.fail(where, f"{list(a.value)}, expected {list(e.value)}")
        elif a.value != e.value:
            self.fail(where, f"{a.value}, expected {e.value}")

    def value(self, a: ir.Value | None, e: ir.Value | None, where: str) -> None:
        if a is None or e is None:
            if a is not e:
                self.fail(
                    where,
                    f"{'no value' if a is None else a.name}, expected {'none' if e is None else e.name}",
                )
            return
        if a in self.values:
            if self.values[a] is not e:
                self.fail(
                    where,
                    f"reads {a.name}, which stands for {self.values[a].name}, expected {e.name}",
                )
            return
        if a.const_value is not None and a.producer() is None and not a.is_graph_input():
            if e.const_value is None or e.producer() is not None or e.is_graph_input():
                self.fail(where, f"reads the constant {a.name}, expected {e.name}")
            self.array(a.const_value.numpy(), e.const_value.numpy(), f"{where} (constant {a.name})")
            return
        self.fail(where, f"reads {a.name}, expected {e.name}")

    def array(self, a: np.ndarray, e: np.ndarray, where: str) -> None:
        if a.dtype != e.dtype or a.shape != e.shape:
            self.fail(where, f"{a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}")
        if a.dtype.kind in "fc":
            if not np.allclose(a, e, rtol=self.rtol, atol=self.atol, equal_nan=True):
                self.fail(where, f"values {a.ravel()[:8]}..., expected {e.ravel()[:8]}...")
        elif not np.array_equal(a, e):
            self.fail(where, f"values {a.ravel()[:8]}..., expected {e.ravel()[:8]}...")


def assert_graph_equal(
    actual: ir.Model, expected: str | ir.Model, *, rtol: float = 1e-6, atol: float = 1e-7
) -> None:
    """Assert that ``actual`` is the graph ``expected`` (ONNX text, read by ``modelpress.ir.parse``).

    Compared: the opset imports; the graph's inputs and outputs (names, types, shapes); how many
    initializers it has (so none is left behind unused); the ops in a canonical topological order (``canonical_order``), each with its domain, attributes (floats
    and tensors within ``rtol``/``atol``, subgraphs recursively) and the values it reads: a graph
    input, a constant (by value), or a given output of a given earlier node; the local functions.
    Names of nodes, intermediate values and initializers need not match.
    """
    want = parse(expected) if isinstance(expected, str) else expected
    compare = _Compare(rtol, atol)
    try:
        if dict(actual.opset_imports) != dict(want.opset_imports):
            compare.fail(
                "model",
                f"opset imports {dict(actual.opset_imports)}, expected {dict(want.opset_imports)}",
            )
        compare.graph(actual.graph, want.graph, "graph", interface=True)
        if sorted(actual.functions) != sorted(want.functions):
            compare.fail(
                "model", f"functions {sorted(actual.functions)}, expected {sorted(want.functions)}"
            )
        for key, function in actual.functions.items():
            compare.graph(
                function.graph, want.functions[key].graph, f"function {key}", interface=False
            )
    except AssertionError as exc:
        got = re.sub(r"\{[^{}]{60,}\}", "{...}", onnx.printer.to_text(to_proto(actual).graph))
        raise AssertionError(f"{exc}\n--- got:\n{got}") from None


# --- refusals ----------------------------------------------------------------------------------


class _Reasons(logging.Handler):
    def __init__(self, pass_name: str):
        super().__init__(logging.DEBUG)
        self.pass_name = pass_name
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "pass_name", None) == self.pass_name:
            self.reasons.append(record.reason)


def refusals(model: ir.Model, pass_name: str) -> list[str]:
    """Run pass ``pass_name`` once on ``model`` (in place) and return the reasons it logged for the
    matches it refused, in order."""
    from modelpress.passes import REGISTRY

    instance = REGISTRY[pass_name]()
    handler = _Reasons(pass_name)
    logger = instance.log
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        instance(model)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.reasons
