"""Graph expansion: extra nodes and edges so that the visible dependencies are not the real ones.

At ``round(ratio * anonymous nodes)`` sites, chosen at random, the graph gains a *decoy* node and
a chain of fake dependencies that is live at run time, yet provably cancels:

    t_i = D_i(s_{i-1}, u_i)      a decoy reads one element of an unrelated tensor u_i
                                 (an edge the real computation does not have): b = [u_i[0] > 0],
                                 t_i = s_{i-1} + b, which is 0 or 1
    s_i = P_i(..., t_i)          the protected node gains that input and one more output: an opaque
                                 predicate of t_i that is 0 for every integer (n(n+1) mod 2;
                                 (n^3 - n) mod 3; n^2 mod 4 == 2 choosing a branch never taken;
                                 2n - (n + n)), drawn per site
    y' = F(y, s_last)            each graph output becomes y - s_last (y xor s_last for booleans;
                                 other types are left alone): the chain's end is subtracted from
                                 the real result, so the runtime cannot drop it as dead code, and the
                                 subtraction of an exact zero leaves every value (even -0.0) alone.

All of it stays in one-element integer tensors: a site costs a few scalar kernels at run time
(about a microsecond each under ONNX Runtime), whatever the tensors' sizes; so its relative cost
is largest on the smallest models. The unrelated tensors are graph inputs or values the graph already reads several
times, so the extra reader blocks no fusion the runtime would make. Decoys and final nodes are
anonymous functions like the rest, so nothing in the file tells them apart from real layers.

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


def _decoy(
    domain: str, op_type: str, u: ir.Value, previous: ir.Value | None, opset: int, opsets: dict
) -> Anonymous:
    """``t = previous + [u.flat[0] > 0]`` (int64, shape [1, ..., 1]) as an anonymous node."""
    formals = [ir.Value(name="u")] + ([ir.Value(name="s")] if previous is not None else [])
    graph = ir.Graph(formals, [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = _Body(graph)
    # Slice one element in every axis: reshaping a tensor that others read would copy it whole.
    rank = len(u.shape)
    zeros, ones = np.zeros(rank, dtype=np.int64), np.ones(rank, dtype=np.int64)
    if opset >= 10:
        first = b.op("Slice", formals[0], b.add(_c(zeros)), b.add(_c(ones)))
    else:
        first = b.add(
            ir.node(
                "Slice", [formals[0]], attributes={"starts": zeros.tolist(), "ends": ones.tolist()}
            )
        )
    scalar = first  # shape [1, ..., 1]: the chain broadcasts to the largest rank; F reduces it
    if u.dtype in _COMPARABLE:
        zero = b.add(_c(np.zeros((), dtype=u.dtype.numpy())))
        positive = b.op("Greater", scalar, zero)
    else:
        positive = b.op(
            "Greater",
            b.op("Cast", scalar, to=ir.DataType.FLOAT),
            b.add(_c(np.array(0.0, dtype=np.float32))),
        )
    t = b.op("Cast", positive, to=ir.DataType.INT64)
    if previous is not None:
        t = b.op("Add", formals[1], t)
    graph.outputs.append(t)
    actuals = [u] + ([previous] if previous is not None else [])
    call = ir.Node(domain, op_type, actuals, num_outputs=1)
    return Anonymous(call, ir.Function(domain, op_type, graph=graph, attributes=[]))


def _thread(site: Anonymous, t: ir.Value, template, opset: int) -> ir.Value:
    """Make ``site`` read ``t`` and return its opaque zero as an extra output."""
    body = site.function.graph
    formal = ir.Value(name=f"in{len(body.inputs)}")
    body.inputs.append(formal)
    body.outputs.append(template(_Body(body), formal))
    call = site.call
    call.resize_inputs(len(call.inputs) + 1)
    call.replace_input_with(len(call.inputs) - 1, t)
    call.resize_outputs(len(call.outputs) + 1)
    return call.outputs[-1]


def _final(domain: str, op_type: str, y: ir.Value, s: ir.Value, opsets: dict) -> Anonymous:
    """``y - s`` (``s`` is an exact zero), or for a boolean ``y``, ``y xor (s != 0)``."""
    fy, fs = ir.Value(name="y"), ir.Value(name="s")
    graph = ir.Graph([fy, fs], [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = _Body(graph)
    zero = b.op("ReduceMax", fs, keepdims=0)  # a scalar: y keeps its own shape whatever its rank
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
