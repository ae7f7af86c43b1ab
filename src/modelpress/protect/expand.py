"""Graph expansion: extra nodes and edges so that the visible dependencies are not the real ones.

At ``round(ratio * anonymous nodes)`` sites, chosen at random, the graph gains a *decoy* node and
a chain of fake dependencies that is live at run time, yet provably never changes a value:

    t_1 = D_1(u_1)               the first decoy compares one element of an unrelated tensor u_1
                                 (an edge the real computation does not have) with the largest
                                 value of its type: t_1 = [u_1[0] > max], false (NaN included)
    t_i = D_i(s_{i-1}, u_i)      each next decoy: If(s_{i-1}, then: [u_i[0] > 0], else: false)
    s_i = P_i(..., t_i)          the protected node gains that input and one more output:
                                 If(t_i, then: an opaque predicate of t_i that is 0 for every
                                 integer (n(n+1) mod 2; (n^3 - n) mod 3; n^2 mod 4 == 2 choosing a
                                 branch never taken; 2n - (n + n)), drawn per site, else: false)
    y' = F(y, s_last)            each graph output becomes y - s_last (y xor s_last for booleans;
                                 other types are left alone): the chain's end is subtracted from
                                 the real result, so the runtime cannot drop it as dead code, and the
                                 subtraction of an exact zero leaves every value (even -0.0) alone.

No folder can evaluate the chain (it starts from data), so every decoy, predicate and If stays in
the graph, for every reader and tool; at run time a branch that is never taken costs nothing, so
a site costs two one-element kernels (its decoy's If and its predicate's If, about a microsecond
each under ONNX Runtime), whatever the tensors' sizes. The unrelated tensors are graph inputs or
values the graph already reads several times, so the extra reader blocks no fusion the runtime
would make. Decoys and final nodes are anonymous functions like the rest, so nothing in the file
tells them apart from real layers.

Precondition: the graph is sorted and its anonymous nodes are ``Anonymous`` pairs (``optypes``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from modelpress.protect.optypes import Anonymous

_SUBTRACTABLE = {
    ir.DataType.FLOAT,
    ir.DataType.DOUBLE,
    ir.DataType.FLOAT16,
    ir.DataType.INT32,
    ir.DataType.INT64,
}
_READABLE = _SUBTRACTABLE | {
    ir.DataType.BOOL,
    ir.DataType.INT8,
    ir.DataType.UINT8,
    ir.DataType.INT16,
    ir.DataType.UINT16,
    ir.DataType.UINT32,
    ir.DataType.UINT64,
    ir.DataType.BFLOAT16,
}


_FINAL_TYPES = _SUBTRACTABLE | {ir.DataType.BOOL}
_COMPARABLE = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT32, ir.DataType.INT64}


def _readable(value: ir.Value) -> bool:
    """A tensor of known rank (at least 1) and a numeric or boolean type: a decoy can read it."""
    return (
        isinstance(value.type, ir.TensorType)
        and value.dtype in _READABLE
        and value.shape is not None
        and len(value.shape) >= 1
    )


def _c(array) -> ir.Node:
    return ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(array))})


def _i64(v: int) -> ir.Node:
    return _c(np.array(v, dtype=np.int64))


class _Body:
    """Appends nodes to a function body; ``op`` returns the (first) output."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph

    def add(self, node: ir.Node) -> ir.Value:
        self.graph.append(node)
        return node.outputs[0]

    def op(self, op_type: str, *inputs: ir.Value, **attrs) -> ir.Value:
        return self.add(ir.node(op_type, list(inputs), attributes=attrs))

    def const(self, v: int) -> ir.Value:
        return self.add(_i64(v))


def _parity(b: _Body, n: ir.Value) -> ir.Value:  # n(n+1) is even
    return b.op("Mod", b.op("Mul", n, b.op("Add", n, b.const(1))), b.const(2))


def _cubic(b: _Body, n: ir.Value) -> ir.Value:  # n^3 - n = (n-1) n (n+1) is a multiple of 3
    return b.op("Mod", b.op("Sub", b.op("Mul", b.op("Mul", n, n), n), n), b.const(3))


def _square(
    b: _Body, n: ir.Value
) -> ir.Value:  # n^2 mod 4 is 0 or 1, never 2: a branch never taken
    sq = b.op("Mul", n, n)
    never = b.op("Equal", b.op("Mod", sq, b.const(4)), b.const(2))
    return b.op("Where", never, b.op("Add", sq, b.const(5)), b.const(0))


def _cancel(b: _Body, n: ir.Value) -> ir.Value:  # 2n - (n + n)
    return b.op("Sub", b.op("Mul", n, b.const(2)), b.op("Add", n, n))


def _templates(opset: int) -> list[Callable[[_Body, ir.Value], ir.Value]]:
    # Mod exists from opset 10, Where from 9.
    return [_parity, _cubic, _square, _cancel] if opset >= 10 else [_cancel]


def _if(b: _Body, gate: ir.Value, then: _Body, rank: int) -> ir.Value:
    """``If(gate, then, else: false of shape [1] * rank)``: ``gate`` is never true, so at run time
    the If costs one kernel whatever ``then`` holds."""
    other = _Body(ir.Graph([], [], nodes=[], name="else"))
    other.graph.outputs.append(other.add(_c(np.zeros([1] * rank, dtype=np.bool_))))
    return b.add(
        ir.node(
            "If",
            [gate],
            attributes={
                "then_branch": ir.AttrGraph("then_branch", then.graph),
                "else_branch": ir.AttrGraph("else_branch", other.graph),
            },
        )
    )


def _first(b: _Body, u: ir.Value, rank: int, opset: int) -> ir.Value:
    """One element of ``u`` (shape [1, ..., 1]): a reshape of a tensor others read would copy it."""
    zeros, ones = np.zeros(rank, dtype=np.int64), np.ones(rank, dtype=np.int64)
    if opset >= 10:
        return b.op("Slice", u, b.add(_c(zeros)), b.add(_c(ones)))
    return b.add(
        ir.node("Slice", [u], attributes={"starts": zeros.tolist(), "ends": ones.tolist()})
    )


def _above(b: _Body, x: ir.Value, dtype: ir.DataType | None, top: bool) -> ir.Value:
    """``x > 0`` or, with ``top``, ``x > the largest value of its type`` (never true, NaN
    included), on a comparable type (other types are cast to float first)."""
    if dtype not in _COMPARABLE:
        x, dtype = b.op("Cast", x, to=ir.DataType.FLOAT), ir.DataType.FLOAT
    np_type = dtype.numpy()
    bound = (np.inf if np_type.kind == "f" else np.iinfo(np_type).max) if top else 0
    return b.op("Greater", x, b.add(_c(np.array(bound, dtype=np_type))))


def _decoy(
    domain: str, op_type: str, u: ir.Value, previous: ir.Value | None, opset: int, opsets: dict
) -> Anonymous:
    """The chain's next value (boolean, never true) as an anonymous node that reads ``u``.

    The first decoy compares an element of ``u`` with the largest value of its type; each next
    one is ``If(previous, then: an element of u > 0, else: false)``: one kernel at run time."""
    formals = [ir.Value(name="u")] + ([ir.Value(name="s")] if previous is not None else [])
    graph = ir.Graph(formals, [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = _Body(graph)
    rank = len(u.shape)
    if previous is None:
        t = _above(b, _first(b, formals[0], rank, opset), u.dtype, top=True)
    else:
        then = _Body(ir.Graph([], [], nodes=[], name="then"))
        then.graph.outputs.append(
            _above(then, _first(then, formals[0], rank, opset), u.dtype, top=False)
        )
        t = _if(b, formals[1], then, rank)
    graph.outputs.append(t)
    actuals = [u] + ([previous] if previous is not None else [])
    call = ir.Node(domain, op_type, actuals, num_outputs=1)
    return Anonymous(call, ir.Function(domain, op_type, graph=graph, attributes=[]))


def _thread(site: Anonymous, t: ir.Value, template, opset: int) -> ir.Value:
    """Make ``site`` read ``t`` and return ``If(t, then: template(t) != 0, else: false)`` as an
    extra output: the opaque predicate sits in the branch that is never taken."""
    body = site.function.graph
    formal = ir.Value(name=f"in{len(body.inputs)}")
    body.inputs.append(formal)
    then = _Body(ir.Graph([], [], nodes=[], name="then"))
    zero = template(then, then.op("Cast", formal, to=ir.DataType.INT64))
    zero = then.op("ReduceMax", zero, keepdims=0)
    then.graph.outputs.append(then.op("Cast", zero, to=ir.DataType.BOOL))
    body.outputs.append(_if(_Body(body), formal, then, 0))
    call = site.call
    call.resize_inputs(len(call.inputs) + 1)
    call.replace_input_with(len(call.inputs) - 1, t)
    call.resize_outputs(len(call.outputs) + 1)
    out = call.outputs[-1]
    out.type, out.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
    return out


def _final(domain: str, op_type: str, y: ir.Value, s: ir.Value, opsets: dict) -> Anonymous:
    """``y - s`` (``s`` is false: an exact zero), or for a boolean ``y``, ``y xor s``."""
    fy, fs = ir.Value(name="y"), ir.Value(name="s")
    graph = ir.Graph([fy, fs], [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = _Body(graph)
    if s.shape is not None and len(s.shape) == 0:  # the chain ends in a scalar: y keeps its shape
        zero = fs
    else:  # a scalar: y keeps its own shape whatever its rank
        zero = b.op("ReduceMax", b.op("Cast", fs, to=ir.DataType.INT64), keepdims=0)
    if y.dtype in _SUBTRACTABLE:
        out = b.op("Sub", fy, b.op("Cast", zero, to=y.dtype))
    else:
        out = b.op("Xor", fy, b.op("Cast", zero, to=ir.DataType.BOOL))
    graph.outputs.append(out)
    call = ir.Node(domain, op_type, [y, s], num_outputs=1)
    return Anonymous(call, ir.Function(domain, op_type, graph=graph, attributes=[]))


def expand(
    graph: ir.Graph,
    anonymous: list[Anonymous],
    *,
    ratio: float,
    rng: np.random.Generator,
    domain: str,
    new_type: Callable[[], str],
    opset: int,
    opsets: dict[str, int],
) -> list[Anonymous]:
    """Add decoys and the cancelling chain to ``graph`` (in place); returns the new anonymous
    nodes (decoys and finals), whose functions the caller adds to the library."""
    count = round(ratio * len(anonymous))
    if count == 0 or not anonymous:
        return []
    order = {node: i for i, node in enumerate(graph)}
    by_call = {a.call: a for a in anonymous}
    calls = sorted(by_call, key=order.__getitem__)
    sites = sorted(rng.choice(len(calls), size=min(count, len(calls)), replace=False).tolist())
    graph_inputs = [v for v in graph.inputs if _readable(v) and not v.is_initializer()]
    templates = _templates(opset)
    added: list[Anonymous] = []
    previous: ir.Value | None = None
    for index in sites:
        call = calls[index]
        own = set(call.inputs)
        candidates = list(graph_inputs)
        for earlier in calls[:index]:
            # Intermediate values of rank 4 and up are left alone: ONNX Runtime keeps convolution
            # activations in a blocked layout, and one more reader costs a full reordering copy.
            candidates += [
                o
                for o in earlier.outputs
                if _readable(o) and len(o.uses()) >= 2 and len(o.shape) <= 3
            ]
        candidates = [v for v in candidates if v not in own] or graph_inputs
        if not candidates:
            continue
        u = candidates[int(rng.integers(len(candidates)))]
        decoy = _decoy(domain, new_type(), u, previous, opset, opsets)
        graph.insert_before(call, decoy.call)
        added.append(decoy)
        template = templates[int(rng.integers(len(templates)))]
        previous = _thread(by_call[call], decoy.call.outputs[0], template, opset)
    if previous is None:
        return added
    for i, y in enumerate(list(graph.outputs)):
        if (
            y.producer() is None
            or not isinstance(y.type, ir.TensorType)
            or y.dtype not in _FINAL_TYPES
        ):
            continue  # a graph input passed through, or a type the runtime cannot subtract
        final = _final(domain, new_type(), y, previous, opsets)
        graph.append(final.call)
        out = final.call.outputs[0]
        out.type, out.shape = y.type, y.shape
        graph.outputs[i] = out
        out.name, y.name = y.name, None
        added.append(final)
    return added


# Type decoys: one more node of each op type the original model uses, so that no type keeps its
# original count once a reader inlines the library (the histogram of the inlined graph otherwise
# says "12 Conv, 12 Relu, 1 Gemm"). Each builder makes a node of its type from f, a float
# [1, 1, 1, 1] that depends on a graph input (so no folder can evaluate it); every result is
# reduced to a scalar, summed, and compared with +inf: never greater (NaN and inf included), so
# the chain's value is an exact 0, subtracted from the outputs like the expansion chain's.
_F32 = ir.DataType.FLOAT


def _ones(b: _Body, rank: int) -> ir.Value:
    return b.add(_c(np.ones(rank, dtype=np.int64)))


def _unary(op: str, since: int = 1, **attrs):
    def build(b: _Body, f: ir.Value, opset: int):
        return b.op(op, f, **attrs) if opset >= since else None

    return build


def _binary(op: str, since: int = 1):
    def build(b: _Body, f: ir.Value, opset: int):
        return b.op(op, f, f) if opset >= since else None

    return build


def _vec(b: _Body, f: ir.Value) -> ir.Value:
    return b.op("Reshape", f, _ones(b, 1))


def _mat(b: _Body, f: ir.Value) -> ir.Value:
    return b.op("Reshape", f, _ones(b, 2))


def _axes(op: str):
    def build(b: _Body, f: ir.Value, opset: int):
        if opset >= 13:
            return b.op(op, f, b.add(_c(np.array([0], dtype=np.int64))))
        return b.add(ir.node(op, [f], attributes={"axes": [0]}))

    return build


def _slice(b: _Body, f: ir.Value, opset: int):
    if opset < 10:
        return b.add(ir.node("Slice", [f], attributes={"starts": [0], "ends": [1]}))
    zero = b.add(_c(np.array([0], dtype=np.int64)))
    return b.op("Slice", f, zero, b.add(_c(np.array([1], dtype=np.int64))))


def _norm(op: str, inputs: int, since: int = 1):
    def build(b: _Body, f: ir.Value, opset: int):
        if opset < since:
            return None
        r = _vec(b, f)
        return b.add(ir.node(op, [f] + [r] * inputs))

    return build


def _logic(op: str):
    def build(b: _Body, f: ir.Value, opset: int):
        return b.op(op, b.op("Less", f, f), b.op("Less", f, f))

    return build


def _range(b: _Body, f: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    start = b.op("ReduceMax", f, keepdims=0)
    one = b.add(_c(np.array(1.0, dtype=np.float32)))
    return start, b.op("Add", start, one), one  # one element


def _quantize(b: _Body, f: ir.Value, opset: int):
    if opset < 10:
        return None
    scale = b.add(_c(np.array(1.0, dtype=np.float32)))
    return b.op("DequantizeLinear", b.op("QuantizeLinear", f, scale), scale)


_TYPE_DECOYS = {
    **{
        op: _unary(op)
        for op in (
            "Relu",
            "Sigmoid",
            "Tanh",
            "Sqrt",
            "Exp",
            "Abs",
            "Neg",
            "Softplus",
            "Softsign",
            "Floor",
            "Ceil",
            "Log",
            "Reciprocal",
            "HardSigmoid",
            "LeakyRelu",
            "Elu",
            "Selu",
            "Softmax",
            "LogSoftmax",
            "Hardmax",
            "Transpose",
            "Flatten",
            "Shape",
            "Size",
            "GlobalAveragePool",
            "GlobalMaxPool",
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceSumSquare",
            "ReduceLogSumExp",
            "ArgMax",
            "ArgMin",
            "Clip",
            "Identity",
        )
    },
    **{
        op: _unary(op, since)
        for op, since in (
            ("Erf", 9),
            ("Sign", 9),
            ("IsNaN", 9),
            ("IsInf", 10),
            ("Round", 11),
            ("Sin", 7),
            ("Cos", 7),
            ("HardSwish", 14),
            ("Mish", 18),
            ("Gelu", 20),
            ("Celu", 12),
        )
    },
    **{
        op: _binary(op)
        for op in (
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Max",
            "Min",
            "Sum",
            "Mean",
            "Equal",
            "Greater",
            "Less",
            "Conv",
            "ConvTranspose",
        )
    },
    "GreaterOrEqual": _binary("GreaterOrEqual", 12),
    "LessOrEqual": _binary("LessOrEqual", 12),
    "MatMul": lambda b, f, opset: b.op("MatMul", _mat(b, f), _mat(b, f)),
    "Gemm": lambda b, f, opset: b.op("Gemm", _mat(b, f), _mat(b, f)),
    "Einsum": lambda b, f, o: (
        b.op("Einsum", _mat(b, f), _mat(b, f), equation="ij,jk->ik") if o >= 12 else None
    ),
    "Trilu": lambda b, f, o: b.op("Trilu", _mat(b, f)) if o >= 14 else None,
    "MaxPool": lambda b, f, opset: b.op("MaxPool", f, kernel_shape=[1, 1]),
    "AveragePool": lambda b, f, opset: b.op("AveragePool", f, kernel_shape=[1, 1]),
    "Reshape": lambda b, f, opset: b.op("Reshape", f, _ones(b, 3)),
    "Expand": lambda b, f, o: b.op("Expand", f, _ones(b, 4)) if o >= 8 else None,
    "Tile": lambda b, f, o: b.op("Tile", f, _ones(b, 4)) if o >= 6 else None,
    "Concat": lambda b, f, opset: b.add(ir.node("Concat", [f, f], attributes={"axis": 0})),
    "Gather": lambda b, f, opset: b.op("Gather", f, b.add(_c(np.array([0], dtype=np.int64)))),
    "Where": lambda b, f, o: b.op("Where", b.op("Less", f, f), f, f) if o >= 9 else None,
    "ConstantOfShape": lambda b, f, o: (
        b.op("ConstantOfShape", b.op("Shape", f)) if o >= 9 else None
    ),
    "Mod": lambda b, f, o: b.op("Mod", f, f, fmod=1) if o >= 10 else None,
    "CumSum": lambda b, f, o: (
        b.op("CumSum", f, b.add(_c(np.array(0, dtype=np.int64)))) if o >= 11 else None
    ),
    "Range": lambda b, f, o: b.op("Range", *_range(b, f)) if o >= 11 else None,
    **{op: _logic(op) for op in ("And", "Or", "Xor")},
    "Not": lambda b, f, opset: b.op("Not", b.op("Less", f, f)),
    "Squeeze": _axes("Squeeze"),
    "Unsqueeze": _axes("Unsqueeze"),
    "Slice": _slice,
    "BatchNormalization": _norm("BatchNormalization", 4),
    "InstanceNormalization": _norm("InstanceNormalization", 2),
    "LayerNormalization": _norm("LayerNormalization", 2, since=17),
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _quantize,
}


_FOLDED_OFTEN = {
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Shape",
    "Gather",
    "Cast",
    "Concat",
    "Slice",
    "Expand",
    "Identity",
    "Transpose",
    "ConstantOfShape",
    "Range",
    "Equal",
    "Where",
    "Flatten",
    "Size",
}


def _copies(op_type: str, count: int) -> int:
    """How many decoys of ``op_type`` (``count`` in the original): never the original count, so
    that a tool that removes or converts every real node of the type leaves a different count."""
    copies = 2 if op_type in _FOLDED_OFTEN else 1
    return copies + 1 if copies == count else copies


def _type_zero(
    b: _Body,
    formal: ir.Value,
    u: ir.Value,
    wanted: dict[str, int],
    rng,
    opset: int,
    gate: ir.Value | None = None,
) -> ir.Value:
    """The decoys of ``wanted`` types (type -> copies) on the first element of ``formal`` (the
    body's name for ``u``), and their result: false (a scalar).

    The decoys sit in the branch of an ``If`` that is never taken (``gate``: by default, that
    element is greater than the largest value of its type, which none is, NaN included): they
    are in the graph for every reader and tool, no folder can evaluate the condition, and at run
    time they cost nothing."""
    rank = len(u.shape)
    if gate is None:
        gate = _above(b, _first(b, formal, rank, opset), u.dtype, top=True)
    branch = _Body(ir.Graph([], [], nodes=[], name="then"))
    value = branch.op("Cast", _first(branch, formal, rank, opset), to=_F32)
    inf = branch.add(_c(np.array(np.inf, dtype=np.float32)))
    # f's shape is [1, 1, 1, 1] computed from data (ones plus a zero no folder can evaluate), so
    # that no tool can fold the shape ops among the decoys either
    zero = branch.op(
        "Reshape",
        branch.op("Cast", branch.op("Greater", value, inf), to=ir.DataType.INT64),
        _ones(branch, 1),
    )
    f = branch.op("Reshape", value, branch.op("Add", _ones(branch, 4), zero))
    scalars = []
    order = sorted(wanted)
    for t in [order[i] for i in rng.permutation(len(order))]:
        # shape ops are the ones optimizers remove from a graph: one removed from the real ones
        # would bring a single decoy's type back to its count
        for copy in range(wanted[t]):
            # each copy reads its own value: a runtime's common-subexpression elimination would
            # merge identical ones back into one
            source = f if copy == 0 else branch.op("Add", f, branch.add(_c(np.float32(copy))))
            out = _TYPE_DECOYS[t](branch, source, opset)
            if out is not None:
                scalars.append(branch.op("ReduceMax", branch.op("Cast", out, to=_F32), keepdims=0))
    branch.graph.outputs.append(branch.op("Greater", branch.op("Sum", *scalars), inf))
    return _if(b, gate, branch, 0)


def type_decoys(
    graph: ir.Graph,
    types: dict[str, int],
    *,
    rng: np.random.Generator,
    domain: str,
    new_type: Callable[[], str],
    opset: int,
    opsets: dict[str, int],
    into: Anonymous | None = None,
) -> list[Anonymous]:
    """Decoy nodes of each op type in ``types`` (default domain; type -> its count in the
    original) that has a builder, as many as ``_copies`` says. With
    ``into`` (the expansion chain's first decoy), inside it: its zero joins the chain. Else in a
    new anonymous node whose zero every output subtracts. Returns the new anonymous nodes."""
    wanted = {t: _copies(t, c) for t, c in types.items() if t in _TYPE_DECOYS}
    if not wanted:
        return []
    if into is not None:
        body = into.function.graph
        b = _Body(body)
        u = into.call.inputs[0]
        # the decoy's value (never true) is the If's condition: the If's value takes its place
        gate = body.outputs[0]
        body.outputs[0] = _type_zero(b, body.inputs[0], u, wanted, rng, opset, gate=gate)
        return []
    sources = [v for v in graph.inputs if _readable(v) and not v.is_initializer()]
    if not sources:
        return []
    u = sources[int(rng.integers(len(sources)))]
    op_type = new_type()
    formal = ir.Value(name="u")
    body = ir.Graph([formal], [], nodes=[], opset_imports=dict(opsets), name=op_type)
    body.outputs.append(_type_zero(_Body(body), formal, u, wanted, rng, opset))
    call = ir.Node(domain, op_type, [u], num_outputs=1)
    decoy = Anonymous(call, ir.Function(domain, op_type, graph=body, attributes=[]))
    graph.insert_before(next(iter(graph)), call)
    added = [decoy]
    s = call.outputs[0]
    s.type, s.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
    for i, y in enumerate(list(graph.outputs)):
        if (
            y.producer() is None
            or not isinstance(y.type, ir.TensorType)
            or y.dtype not in _FINAL_TYPES
        ):
            continue
        final = _final(domain, new_type(), y, s, opsets)
        graph.append(final.call)
        out = final.call.outputs[0]
        out.type, out.shape = y.type, y.shape
        graph.outputs[i] = out
        out.name, y.name = y.name, None
        added.append(final)
    return added
