"""Type decoys: one more node of each op type the original model uses, so that no type keeps its
original count once a reader inlines the library (the histogram of the inlined graph otherwise
says "12 Conv, 12 Relu, 1 Gemm").

Each builder makes a node of its type from f, a float [1, 1, 1, 1] that depends on a graph input
(so no folder can evaluate it); every result is reduced to a scalar, summed, and compared with
+inf: never greater (NaN and inf included), so the chain's value is an exact 0, subtracted from
the outputs like the expansion chain's (``expand``). The decoys sit in a branch never taken.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from modelpress.ir.match import ARITHMETIC, GLOBAL_POOLS, REDUCTIONS
from modelpress.protect.branches import (
    Body,
    above,
    cancel_outputs,
    constant,
    first_element,
    if_never,
    ones,
    readable,
)
from modelpress.protect.optypes import Anonymous

_F32 = ir.DataType.FLOAT


def _unary(op: str, since: int = 1, **attrs):
    def build(b: Body, f: ir.Value, opset: int):
        return b.op(op, f, **attrs) if opset >= since else None

    return build


def _binary(op: str, since: int = 1):
    def build(b: Body, f: ir.Value, opset: int):
        return b.op(op, f, f) if opset >= since else None

    return build


def _vec(b: Body, f: ir.Value) -> ir.Value:
    return b.op("Reshape", f, ones(b, 1))


def _mat(b: Body, f: ir.Value) -> ir.Value:
    return b.op("Reshape", f, ones(b, 2))


def _axes(op: str):
    def build(b: Body, f: ir.Value, opset: int):
        if opset >= 13:
            return b.op(op, f, b.add(constant(np.array([0], dtype=np.int64))))
        return b.add(ir.node(op, [f], attributes={"axes": [0]}))

    return build


def _slice(b: Body, f: ir.Value, opset: int):
    if opset < 10:
        return b.add(ir.node("Slice", [f], attributes={"starts": [0], "ends": [1]}))
    zero = b.add(constant(np.array([0], dtype=np.int64)))
    return b.op("Slice", f, zero, b.add(constant(np.array([1], dtype=np.int64))))


def _norm(op: str, inputs: int, since: int = 1):
    def build(b: Body, f: ir.Value, opset: int):
        if opset < since:
            return None
        r = _vec(b, f)
        return b.add(ir.node(op, [f] + [r] * inputs))

    return build


def _logic(op: str):
    def build(b: Body, f: ir.Value, opset: int):
        return b.op(op, b.op("Less", f, f), b.op("Less", f, f))

    return build


def _range(b: Body, f: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    start = b.op("ReduceMax", f, keepdims=0)
    one = b.add(constant(np.array(1.0, dtype=np.float32)))
    return start, b.op("Add", start, one), one  # one element


def _quantize(b: Body, f: ir.Value, opset: int):
    if opset < 10:
        return None
    scale = b.add(constant(np.array(1.0, dtype=np.float32)))
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
            *GLOBAL_POOLS,
            *REDUCTIONS,
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
        op: _binary(op) for op in (*ARITHMETIC, "Equal", "Greater", "Less", "Conv", "ConvTranspose")
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
    "Reshape": lambda b, f, opset: b.op("Reshape", f, ones(b, 3)),
    "Expand": lambda b, f, o: b.op("Expand", f, ones(b, 4)) if o >= 8 else None,
    "Tile": lambda b, f, o: b.op("Tile", f, ones(b, 4)) if o >= 6 else None,
    "Concat": lambda b, f, opset: b.add(ir.node("Concat", [f, f], attributes={"axis": 0})),
    "Gather": lambda b, f, opset: b.op("Gather", f, b.add(constant(np.array([0], dtype=np.int64)))),
    "Where": lambda b, f, o: b.op("Where", b.op("Less", f, f), f, f) if o >= 9 else None,
    "ConstantOfShape": lambda b, f, o: (
        b.op("ConstantOfShape", b.op("Shape", f)) if o >= 9 else None
    ),
    "Mod": lambda b, f, o: b.op("Mod", f, f, fmod=1) if o >= 10 else None,
    "CumSum": lambda b, f, o: (
        b.op("CumSum", f, b.add(constant(np.array(0, dtype=np.int64)))) if o >= 11 else None
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
    b: Body,
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
        gate = above(b, first_element(b, formal, rank, opset), u.dtype, top=True)
    branch = Body(ir.Graph([], [], nodes=[], name="then"))
    value = branch.op("Cast", first_element(branch, formal, rank, opset), to=_F32)
    inf = branch.add(constant(np.array(np.inf, dtype=np.float32)))
    # f's shape is [1, 1, 1, 1] computed from data (ones plus a zero no folder can evaluate), so
    # that no tool can fold the shape ops among the decoys either
    zero = branch.op(
        "Reshape",
        branch.op("Cast", branch.op("Greater", value, inf), to=ir.DataType.INT64),
        ones(branch, 1),
    )
    f = branch.op("Reshape", value, branch.op("Add", ones(branch, 4), zero))
    scalars = []
    order = sorted(wanted)
    for t in [order[i] for i in rng.permutation(len(order))]:
        # shape ops are the ones optimizers remove from a graph: one removed from the real ones
        # would bring a single decoy's type back to its count
        for copy in range(wanted[t]):
            # each copy reads its own value: a runtime's common-subexpression elimination would
            # merge identical ones back into one
            source = f if copy == 0 else branch.op("Add", f, branch.add(constant(np.float32(copy))))
            out = _TYPE_DECOYS[t](branch, source, opset)
            if out is not None:
                scalars.append(branch.op("ReduceMax", branch.op("Cast", out, to=_F32), keepdims=0))
    branch.graph.outputs.append(branch.op("Greater", branch.op("Sum", *scalars), inf))
    return if_never(b, gate, branch, 0)


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
        b = Body(body)
        u = into.call.inputs[0]
        # the decoy's value (never true) is the If's condition: the If's value takes its place
        gate = body.outputs[0]
        body.outputs[0] = _type_zero(b, body.inputs[0], u, wanted, rng, opset, gate=gate)
        return []
    sources = [v for v in graph.inputs if readable(v) and not v.is_initializer()]
    if not sources:
        return []
    u = sources[int(rng.integers(len(sources)))]
    op_type = new_type()
    formal = ir.Value(name="u")
    body = ir.Graph([formal], [], nodes=[], opset_imports=dict(opsets), name=op_type)
    body.outputs.append(_type_zero(Body(body), formal, u, wanted, rng, opset))
    call = ir.Node(domain, op_type, [u], num_outputs=1)
    decoy = Anonymous(call, ir.Function(domain, op_type, graph=body, attributes=[]))
    graph.insert_before(next(iter(graph)), call)
    s = call.outputs[0]
    s.type, s.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
    return [decoy, *cancel_outputs(graph, s, domain=domain, new_type=new_type, opsets=opsets)]
