"""Small helpers shared by the passes: constants, value replacement, node creation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node) as numpy, else None.

    Graph inputs that double as initializers are not constants: the caller may override them.
    """
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
            return None
        # Read the common `value` attribute directly: get_const_tensor's protocol isinstance checks
        # cost ~4x more and dominated pattern-matching passes on models with many Constant nodes.
        attr = producer.attributes.get("value")
        tensor = attr.value if attr is not None and attr.type == ir.AttributeType.TENSOR else ir.convenience.get_const_tensor(value)
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
        node.outputs[0].name = unique_name(graph, name_hint)
        return node.outputs[0]
    name = unique_name(graph, name_hint)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array, name=name))
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
        if new.is_graph_input() or new.is_graph_output() or new.is_initializer() or producer is None or producer.graph is not graph:
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
        starts, ends, axes, steps = (None if a is None else [int(v) for v in a.reshape(-1)] for a in arrays)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not (len(starts) == len(ends) == len(axes) == len(steps)) or 0 in steps:
        return None
    return starts, ends, axes, steps


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
        return insert_node(graph, before, "Slice", [data], {"starts": starts, "ends": ends, "axes": axes}, like=like)
    arrays = [np.array(v, dtype=np.int64) for v in (starts, ends, axes, steps)]
    names = [f"{name_hint}_{part}" for part in ("starts", "ends", "axes", "steps")]
    inputs = [add_initializer(graph, a, n) for a, n in zip(arrays, names)]
    return insert_node(graph, before, "Slice", [data, *inputs], like=like)


def graph_opset(graph: ir.Graph | ir.Function, model: ir.Model, domain: str = "") -> int:
    """The opset version of ``domain`` that applies inside ``graph`` (a function may import its own)."""
    if isinstance(graph, ir.Function) and domain in graph.opset_imports:
        return graph.opset_imports[domain]
    return model.opset_imports.get(domain, 0)


def ensure_types(model: ir.Model) -> None:
    """``infer_types(model)`` when some node output has no dtype.

    Rules that compare dtypes or shapes need them on intermediate values, which files often omit.
    """
    from modelpress.ir.stats import iter_nodes

    if any(out.type is None for node in iter_nodes(model.graph) for out in node.outputs if out.name):
        infer_types(model)


def infer_types(model: ir.Model) -> None:
    """ONNX shape inference (with data propagation), merged into ``model`` in place, best effort.

    A value takes the inferred type when it has none, and the inferred shape when that knows at
    least as many static dimensions; graph inputs and outputs keep what they declare, so dynamic
    dimensions stay dynamic and keep their names. (onnx_ir's ShapeInferencePass merges only the
    element dtype, which turns a sequence or optional value into a tensor.)
    """
    import onnx
    from onnx_ir.passes.common import _c_api_utils

    from modelpress.ir.stats import iter_graphs

    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)

    try:
        # Drops large initializers' data for the call, so a big model is not copied through protobuf.
        inferred = _c_api_utils.call_onnx_api(infer, model)
    except Exception:  # noqa: BLE001 - inference is an aid; a model it cannot handle stays as it is
        return
    types: dict[str, onnx.TypeProto] = {}
    stack = [inferred.graph]
    while stack:
        g = stack.pop()
        for info in list(g.value_info) + list(g.output):
            types[info.name] = info.type
        for node in g.node:
            for attr in node.attribute:
                stack.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    for graph in iter_graphs(model.graph):
        for node in graph:
            for value in node.outputs:
                proto = types.get(value.name) if value.name else None
                if proto is None or not proto.WhichOneof("value"):
                    continue
                if value.type is None:
                    value.type = ir.serde.deserialize_type_proto_for_type(proto)
                shape = ir.serde.deserialize_type_proto_for_shape(proto)
                # A graph output keeps the shape it declares (its dimension names are interface).
                if value.is_graph_output() and value.shape is not None:
                    continue
                if shape is not None and _more_static(shape, value.shape):
                    value.shape = shape


def _more_static(new: ir.Shape, old: ir.Shape | None) -> bool:
    if old is None:
        return True
    if len(new) != len(old):
        return False
    count = lambda s: sum(isinstance(d, int) for d in s)  # noqa: E731
    return count(new) >= count(old) and new != old


def replace_with_new(old: ir.Value, new: ir.Value) -> None:
    """``replace_value(old, new)`` for a ``new`` made by a freshly inserted node, which also takes
    ``old``'s name. onnx_ir names new values per graph ("val_0", ...), so a value made in a
    subgraph could otherwise share its name with one of the outer graph, which breaks SSA."""
    name = old.name
    replace_value(old, new)
    if name and new.name != name:
        old.name = None
        new.name = name


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
