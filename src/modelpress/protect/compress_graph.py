"""Graph compression: the nodes of a graph are partitioned into groups, each of which will become
one anonymous node (``optypes.py``), so the visible graph has one node per group.

The rule: nodes are taken in topological order. An *anchor* (a node with weights, a recurrent or
control-flow node) starts a new group; any other node joins the group of one of its producers,
preferring the most recent. So a convolution takes its BatchNorm and activation, a MatMul its bias
Add and the primitives of a GELU or a LayerNorm, and the products of two activations (the scores
and the context of attention, which are no anchors) fuse the attention core with its projection:
Conv+BN+activation, MatMul+Add+GELU and attention blocks each become a single node.

A node joins a group only when the contracted graph stays acyclic: no path may leave the group and
come back (each group keeps the transitive set of groups it depends on, so the test is one
lookup). Group sizes are capped (a cap drawn per group from the seeded generator, so two seeds
give two different structures), which keeps the visible graph a graph, not one opaque node.

Precondition: ``graph`` is topologically sorted (ONNX requires it). Constant nodes are in no group:
their values are constants, which go into the groups that read them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.stats import subgraphs

MIN_CAP = 6
MAX_CAP = 24
_WEIGHTED = {
    "Conv",
    "ConvTranspose",
    "ConvInteger",
    "QLinearConv",
    "MatMul",
    "Gemm",
    "MatMulInteger",
    "QLinearMatMul",
    "Gather",
    "Einsum",
    "DeformConv",
    "FusedConv",
    "FusedMatMul",
    "FusedGemm",
    "MatMulNBits",
    "QAttention",
    "Attention",
    "MultiHeadAttention",
    "EmbedLayerNormalization",
}
_ALWAYS_ANCHOR = {"LSTM", "GRU", "RNN", "If", "Loop", "Scan"}


def is_constant(value: ir.Value | None) -> bool:
    if value is None:
        return True
    if value.is_initializer() and not value.is_graph_input():
        return True
    producer = value.producer()
    return (
        producer is not None
        and producer.op_type == "Constant"
        and producer.domain in ("", "ai.onnx")
    )


def is_anchor(node: ir.Node) -> bool:
    """Whether ``node`` starts a group: control flow, recurrent layers, and ops that read a weight
    (a constant input of more than one element; for Gather, its table)."""
    if node.op_type in _ALWAYS_ANCHOR:
        return True
    if node.op_type not in _WEIGHTED:
        return False
    reads = node.inputs[:1] if node.op_type == "Gather" else node.inputs
    for value in reads:
        if value is not None and is_constant(value):
            tensor = ir.convenience.get_const_tensor(value)
            if tensor is not None and tensor.size > 1:
                return True
    return False


def find_groups(
    graph: ir.Graph, rng: np.random.Generator, *, uncounted: set[ir.Node] = frozenset()
) -> list[list[ir.Node]]:
    """The groups of ``graph``'s nodes (Constant nodes excluded), each in topological order.
    ``uncounted`` nodes (what an earlier step added around a layer) join groups without counting
    against their caps."""
    group_of: dict[ir.Node, int] = {}
    members: list[list[ir.Node]] = []
    ancestors: list[int] = []  # bit set of the groups each group depends on
    caps: list[int] = []
    sizes: list[int] = []

    def new_group(node: ir.Node) -> int:
        members.append([node])
        sizes.append(0 if node in uncounted else 1)
        ancestors.append(0)
        caps.append(int(rng.integers(MIN_CAP, MAX_CAP + 1)))
        group_of[node] = len(members) - 1
        return len(members) - 1

    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        producers = set()
        for value in reads(node):
            p = value.producer()
            if p is not None and p in group_of:
                producers.add(group_of[p])
        chosen = None
        if not is_anchor(node):
            for g in sorted(producers, reverse=True):
                if sizes[g] >= caps[g]:
                    continue
                # joining g is safe when no other producer group depends on g
                if all(not (ancestors[h] >> g) & 1 for h in producers if h != g):
                    chosen = g
                    break
        if chosen is None:
            g = new_group(node)
            for h in producers:
                ancestors[g] |= ancestors[h] | (1 << h)
            continue
        members[chosen].append(node)
        sizes[chosen] += 0 if node in uncounted else 1
        group_of[node] = chosen
        added = 0
        for h in producers:
            if h != chosen:
                added |= ancestors[h] | (1 << h)
        if added & ~ancestors[chosen]:
            ancestors[chosen] |= added
            # keep the sets transitive: every group that depends on `chosen` now depends on more
            bit = 1 << chosen
            for d in range(len(members)):
                if ancestors[d] & bit:
                    ancestors[d] |= ancestors[chosen]
    return members


def reads(node: ir.Node):
    """The values ``node`` reads, its subgraphs' reads of enclosing scopes included."""
    yield from (v for v in node.inputs if v is not None)
    for g in subgraphs(node):
        yield from outer_reads(g)


def outer_reads(graph: ir.Graph) -> list[ir.Value]:
    """Values of enclosing scopes that ``graph`` (or a graph nested in it) reads."""
    inner: set[ir.Value] = set(graph.inputs) | set(graph.initializers.values())
    found: list[ir.Value] = []
    seen: set[ir.Value] = set()
    for node in graph:
        inner.update(node.outputs)
    for node in graph:
        for value in reads(node):
            if value not in inner and value not in seen:
                seen.add(value)
                found.append(value)
    return found
