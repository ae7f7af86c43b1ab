"""Never-taken branches: the pieces every decoy of ``expand`` and ``type_decoys`` is made of.

A decoy is an anonymous function whose body ``Body`` appends to; its value comes from an ``If``
whose condition is never true (``if_never``: an element of a tensor compared with a bound no value
passes, ``above``), so whatever the branch holds costs nothing at run time. The chain of such
values ends false, and ``cancel_outputs`` subtracts it from the graph's outputs: no value changes,
yet no runtime can drop the chain as dead code.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from modelpress.protect.optypes import Anonymous

SUBTRACTABLE = {
    ir.DataType.FLOAT,
    ir.DataType.DOUBLE,
    ir.DataType.FLOAT16,
    ir.DataType.INT32,
    ir.DataType.INT64,
}
READABLE = SUBTRACTABLE | {
    ir.DataType.BOOL,
    ir.DataType.INT8,
    ir.DataType.UINT8,
    ir.DataType.INT16,
    ir.DataType.UINT16,
    ir.DataType.UINT32,
    ir.DataType.UINT64,
    ir.DataType.BFLOAT16,
}


FINAL_TYPES = SUBTRACTABLE | {ir.DataType.BOOL}
COMPARABLE = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT32, ir.DataType.INT64}


def readable(value: ir.Value) -> bool:
    """A tensor of known rank (at least 1) and a numeric or boolean type: a decoy can read it."""
    return (
        isinstance(value.type, ir.TensorType)
        and value.dtype in READABLE
        and value.shape is not None
        and len(value.shape) >= 1
    )


def constant(array) -> ir.Node:
    return ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(array))})


def _int64(v: int) -> ir.Node:
    return constant(np.array(v, dtype=np.int64))


class Body:
    """Appends nodes to a function body; ``op`` returns the (first) output."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph

    def add(self, node: ir.Node) -> ir.Value:
        self.graph.append(node)
        return node.outputs[0]

    def op(self, op_type: str, *inputs: ir.Value, **attrs) -> ir.Value:
        return self.add(ir.node(op_type, list(inputs), attributes=attrs))

    def const(self, v: int) -> ir.Value:
        return self.add(_int64(v))


def ones(b: Body, rank: int) -> ir.Value:
    return b.add(constant(np.ones(rank, dtype=np.int64)))


def if_never(b: Body, gate: ir.Value, then: Body, rank: int) -> ir.Value:
    """``If(gate, then, else: false of shape [1] * rank)``: ``gate`` is never true, so at run time
    the If costs one kernel whatever ``then`` holds."""
    other = Body(ir.Graph([], [], nodes=[], name="else"))
    other.graph.outputs.append(other.add(constant(np.zeros([1] * rank, dtype=np.bool_))))
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


def first_element(b: Body, u: ir.Value, rank: int, opset: int) -> ir.Value:
    """One element of ``u`` (shape [1, ..., 1]): a reshape of a tensor others read would copy it."""
    zeros, ones = np.zeros(rank, dtype=np.int64), np.ones(rank, dtype=np.int64)
    if opset >= 10:
        return b.op("Slice", u, b.add(constant(zeros)), b.add(constant(ones)))
    return b.add(
        ir.node("Slice", [u], attributes={"starts": zeros.tolist(), "ends": ones.tolist()})
    )


def above(b: Body, x: ir.Value, dtype: ir.DataType | None, top: bool) -> ir.Value:
    """``x > 0`` or, with ``top``, ``x > the largest value of its type`` (never true, NaN
    included), on a comparable type (other types are cast to float first)."""
    if dtype not in COMPARABLE:
        x, dtype = b.op("Cast", x, to=ir.DataType.FLOAT), ir.DataType.FLOAT
    np_type = dtype.numpy()
    bound = (np.inf if np_type.kind == "f" else np.iinfo(np_type).max) if top else 0
    return b.op("Greater", x, b.add(constant(np.array(bound, dtype=np_type))))


def _final(domain: str, op_type: str, y: ir.Value, s: ir.Value, opsets: dict) -> Anonymous:
    """``y - s`` (``s`` is false: an exact zero), or for a boolean ``y``, ``y xor s``."""
    fy, fs = ir.Value(name="y"), ir.Value(name="s")
    graph = ir.Graph([fy, fs], [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = Body(graph)
    if s.shape is not None and len(s.shape) == 0:  # the chain ends in a scalar: y keeps its shape
        zero = fs
    else:  # a scalar: y keeps its own shape whatever its rank
        zero = b.op("ReduceMax", b.op("Cast", fs, to=ir.DataType.INT64), keepdims=0)
    if y.dtype in SUBTRACTABLE:
        out = b.op("Sub", fy, b.op("Cast", zero, to=y.dtype))
    else:
        out = b.op("Xor", fy, b.op("Cast", zero, to=ir.DataType.BOOL))
    graph.outputs.append(out)
    call = ir.Node(domain, op_type, [y, s], num_outputs=1)
    return Anonymous(call, ir.Function(domain, op_type, graph=graph, attributes=[]))


def cancel_outputs(
    graph: ir.Graph,
    s: ir.Value,
    *,
    domain: str,
    new_type: Callable[[], str],
    opsets: dict[str, int],
) -> list[Anonymous]:
    """Make each output ``y`` of ``graph`` (in place) ``y - s`` (``y xor s`` for booleans; other
    types are left alone), ``s`` being a chain's end (false: an exact zero): no value changes, and
    the runtime cannot drop the chain as dead code. Returns the new anonymous nodes."""
    added: list[Anonymous] = []
    for i, y in enumerate(list(graph.outputs)):
        if (
            y.producer() is None
            or not isinstance(y.type, ir.TensorType)
            or y.dtype not in FINAL_TYPES
        ):
            continue  # a graph input passed through, or a type the runtime cannot subtract
        final = _final(domain, new_type(), y, s, opsets)
        graph.append(final.call)
        out = final.call.outputs[0]
        out.type, out.shape = y.type, y.shape
        graph.outputs[i] = out
        out.name, y.name = y.name, None
        added.append(final)
    return added
