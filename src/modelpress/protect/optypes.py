"""Anonymous operator types: each group of nodes (``compress_graph``) is moved into a model-local
function of its own, in a private domain, and replaced by one node that calls it.

The node's op type is a random name and its domain is private to the model, so the visible graph
says nothing of what the node computes: the type histogram is flat (one node per type, the limit
of splitting a type into sets), and every function, being used once, can carry the constants of
its own node. The function's body holds the original nodes; what they read from outside the group
becomes the function's inputs, and what the rest of the graph reads becomes its outputs:

- an activation stays an edge of the visible graph;
- a small constant (or one of a type the perturbation does not cover) moves into the body;
- a weight is stored perturbed (``weights.py``) as a visible initializer; in storage mode the body
  starts with a ``Decode`` placeholder (domain ``mpk.decode``) that the library turns into the
  inverse transform when the model is opened; in runtime mode the body subtracts the noise, a
  graph input whose value the runtime supplies; a mixed weight (``mixing.py``) is read as it is.

The rule's precondition: the group is convex (``compress_graph`` ensures it), so the call node can
be ordered; the caller sorts the graph once all groups are extracted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.stats import iter_nodes, subgraphs
from modelpress.protect.compress_graph import is_constant, reads

DECODE_DOMAIN = "mpk.decode"
DECODE_OP = "Decode"


@dataclass
class Visible:
    """A weight kept in the visible graph as ``stored``: decoded in the body by ``transform``
    (storage mode), or as ``Cast(stored - secret)``, ``secret`` a graph input whose value the
    runtime supplies (runtime mode), or used as it is (neither: a mixed weight, ``mixing.py``)."""

    stored: ir.Value | None  # None: ``sealed`` holds it, inside the function (library)
    transform_json: str | None = None
    secret: ir.Value | None = None
    dtype: ir.DataType | None = None  # the weight's, with ``secret``
    sealed: ir.TensorProtocol | None = None


# Decides, for a constant a group reads: None to move it into the body, or how it stays visible.
ConstantPolicy = Callable[[ir.Value], Visible | None]


@dataclass
class Anonymous:
    call: ir.Node
    function: ir.Function


def const_tensor(value: ir.Value) -> ir.TensorProtocol:
    tensor = ir.convenience.get_const_tensor(value)
    assert tensor is not None, value
    return tensor


def extract(
    graph: ir.Graph,
    nodes: list[ir.Node],
    *,
    domain: str,
    op_type: str,
    opset_imports: dict[str, int],
    policy: ConstantPolicy,
) -> Anonymous:
    """Move ``nodes`` (one convex group of ``graph``) into a new function and put a node calling
    it in their place (appended: the caller sorts the graph afterwards)."""
    members = set(nodes)
    inside = set(nodes)
    for n in nodes:
        inside.update(m for sub in subgraphs(n) for m in iter_nodes(sub))

    externals: list[ir.Value] = []
    seen: set[ir.Value] = set()
    for n in nodes:
        for v in reads(n):
            if v.producer() in members or v in seen:
                continue
            seen.add(v)
            externals.append(v)

    body_head: list[ir.Node] = []
    formals: list[ir.Value] = []
    actuals: list[ir.Value] = []
    mapping: dict[ir.Value, ir.Value] = {}
    for v in externals:
        if is_constant(v):
            visible = policy(v)
            if visible is None:
                const = ir.node("Constant", [], attributes={"value": const_tensor(v)})
                body_head.append(const)
                mapping[v] = const.outputs[0]
                continue
            if visible.sealed is not None:
                formal = ir.node("Constant", [], attributes={"value": visible.sealed})
                body_head.append(formal)
                formal = formal.outputs[0]
            else:
                formal = ir.Value(name=f"in{len(formals)}")
                formals.append(formal)
                actuals.append(visible.stored)
            if visible.secret is not None:
                noise = ir.Value(name=f"in{len(formals)}")
                formals.append(noise)
                actuals.append(visible.secret)
                diff = ir.node("Sub", [formal, noise])
                cast = ir.node("Cast", [diff.outputs[0]], attributes={"to": visible.dtype})
                body_head += [diff, cast]
                mapping[v] = cast.outputs[0]
            elif visible.transform_json is not None:
                decode = ir.node(
                    DECODE_OP,
                    [formal],
                    domain=DECODE_DOMAIN,
                    attributes={"transform": visible.transform_json},
                )
                body_head.append(decode)
                mapping[v] = decode.outputs[0]
            else:
                mapping[v] = formal
        else:
            formal = ir.Value(name=f"in{len(formals)}", type=v.type, shape=v.shape)
            formals.append(formal)
            actuals.append(v)
            mapping[v] = formal
    for n in inside:
        for i, v in enumerate(n.inputs):
            if v is not None and v in mapping:
                n.replace_input_with(i, mapping[v])

    outputs: list[ir.Value] = []
    outside_uses: list[list] = []
    for n in nodes:
        for o in n.outputs:
            uses = [u for u in o.uses() if u.node not in inside]
            if uses or o.is_graph_output():
                outputs.append(o)
                outside_uses.append(uses)

    call = ir.Node(domain, op_type, actuals, num_outputs=len(outputs))
    for old, new, uses in zip(outputs, call.outputs, outside_uses):
        new.type, new.shape = old.type, old.shape
        for use in uses:
            use.node.replace_input_with(use.idx, new)
        if old.is_graph_output():
            for i, out in enumerate(graph.outputs):
                if out is old:
                    graph.outputs[i] = new
            new.name, old.name = old.name, None
    graph.remove(nodes)
    graph.append(call)
    body = ir.Graph(
        formals,
        outputs,
        nodes=[*body_head, *nodes],
        opset_imports=dict(opset_imports),
        name=op_type,
    )
    return Anonymous(call, ir.Function(domain, op_type, graph=body, attributes=[]))
