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

from modelpress.protect.branches import (
    Body,
    above,
    cancel_outputs,
    first_element,
    if_never,
    readable,
)
from modelpress.protect.optypes import Anonymous


def _parity(b: Body, n: ir.Value) -> ir.Value:  # n(n+1) is even
    return b.op("Mod", b.op("Mul", n, b.op("Add", n, b.const(1))), b.const(2))


def _cubic(b: Body, n: ir.Value) -> ir.Value:  # n^3 - n = (n-1) n (n+1) is a multiple of 3
    return b.op("Mod", b.op("Sub", b.op("Mul", b.op("Mul", n, n), n), n), b.const(3))


def _square(b: Body, n: ir.Value) -> ir.Value:  # n^2 mod 4 is 0 or 1, never 2: a branch never taken
    sq = b.op("Mul", n, n)
    never = b.op("Equal", b.op("Mod", sq, b.const(4)), b.const(2))
    return b.op("Where", never, b.op("Add", sq, b.const(5)), b.const(0))


def _cancel(b: Body, n: ir.Value) -> ir.Value:  # 2n - (n + n)
    return b.op("Sub", b.op("Mul", n, b.const(2)), b.op("Add", n, n))


def _templates(opset: int) -> list[Callable[[Body, ir.Value], ir.Value]]:
    # Mod exists from opset 10, Where from 9.
    return [_parity, _cubic, _square, _cancel] if opset >= 10 else [_cancel]


def _decoy(
    domain: str, op_type: str, u: ir.Value, previous: ir.Value | None, opset: int, opsets: dict
) -> Anonymous:
    """The chain's next value (boolean, never true) as an anonymous node that reads ``u``.

    The first decoy compares an element of ``u`` with the largest value of its type; each next
    one is ``If(previous, then: an element of u > 0, else: false)``: one kernel at run time."""
    formals = [ir.Value(name="u")] + ([ir.Value(name="s")] if previous is not None else [])
    graph = ir.Graph(formals, [], nodes=[], opset_imports=dict(opsets), name=op_type)
    b = Body(graph)
    rank = len(u.shape)
    if previous is None:
        t = above(b, first_element(b, formals[0], rank, opset), u.dtype, top=True)
    else:
        then = Body(ir.Graph([], [], nodes=[], name="then"))
        then.graph.outputs.append(
            above(then, first_element(then, formals[0], rank, opset), u.dtype, top=False)
        )
        t = if_never(b, formals[1], then, rank)
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
    then = Body(ir.Graph([], [], nodes=[], name="then"))
    zero = template(then, then.op("Cast", formal, to=ir.DataType.INT64))
    zero = then.op("ReduceMax", zero, keepdims=0)
    then.graph.outputs.append(then.op("Cast", zero, to=ir.DataType.BOOL))
    body.outputs.append(if_never(Body(body), formal, then, 0))
    call = site.call
    call.resize_inputs(len(call.inputs) + 1)
    call.replace_input_with(len(call.inputs) - 1, t)
    call.resize_outputs(len(call.outputs) + 1)
    out = call.outputs[-1]
    out.type, out.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
    return out


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
    graph_inputs = [v for v in graph.inputs if readable(v) and not v.is_initializer()]
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
                if readable(o) and len(o.uses()) >= 2 and len(o.shape) <= 3
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
    return added + cancel_outputs(graph, previous, domain=domain, new_type=new_type, opsets=opsets)
