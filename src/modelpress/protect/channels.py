"""Channel groups: which activations of a graph may carry one hidden permutation of a channel axis
with no operator between the layers to undo it (the analysis ``mixing`` plans its rewrite on).

A layer that computes its output channels from slices of a constant weight (Conv, MatMul, Gemm,
an embedding Gather: a *producer*) can compute them in any order, the weight's output axis
permuted. That order then travels with the activation through every operator that treats the
channels of the axis alike (``HANDLERS``):

- elementwise ops (ReLU, Clip, Sigmoid, Erf, ..., Add, Mul, Div, Where): a constant operand with a
  channel axis of that size is permuted the same way; an operand of size 1 there broadcasts; two
  permuted operands join one group (residual Adds: both branches share the permutation);
- BatchNormalization, InstanceNormalization, LayerNormalization over that axis (their parameters
  permuted), Softmax, pooling, Pad and Slice on other axes, a depthwise Conv (its filters
  permuted), Transpose, Flatten, Squeeze/Unsqueeze and Reshape where the axis stays whole;
- reductions over the axis (ReduceMean, ...) and Shape end it: their result does not depend on
  the order (a reduction's size-1 result broadcasts back over permuted tensors: LayerNorm's
  primitives);
- a *consumer* that sums over the axis (Conv with one group, MatMul, Gemm on its input's last axis)
  absorbs it: its weight's input axis is permuted the same way, and its output is in the original
  order (or starts a group of its own, as a producer).

Anything else that reads a permuted activation, and every graph output, is a *boundary*: there,
the activation is put back in order (``mixing``: a Gather whose indices the runtime supplies).

The analysis walks the main graph once, in order; a group whose permutation would have to be
undone inside the graph (a transformer's query, key and value projections, before the reshape
into attention heads) is given up when each of its producers' weights is permuted on its input
axis anyway (``plan``), so that no operator is added for it. Such a weight keeps its columns in
place: their means line up with the other projections' of the layer (on MiniLM, just above the
chance level the recovery check allows: see docs/protect.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.ir.match import REDUCTIONS
from modelpress.protect.channel_ops import (
    ELEMENTWISE,
    HANDLERS,
    PRODUCERS,
    SAME_RANK,
    Refused,
    attr,
    carried,
    const_array,
)

DEFAULT = ("", "ai.onnx")


@dataclass(frozen=True)
class Edit:
    """Input ``index`` of ``node`` (a constant) is permuted along ``axis`` by ``group``'s order."""

    node: ir.Node
    index: int
    axis: int
    group: int


@dataclass
class Boundary:
    """``value`` (permuted by ``group`` on negative ``axis``) is put back in order for ``users``
    (and for the graph's outputs when ``output``)."""

    value: ir.Value
    group: int
    axis: int
    users: list[ir.Node] = field(default_factory=list)
    output: bool = False
    rank: int | None = None


@dataclass
class Plan:
    sizes: dict[int, int]  # group -> channels (roots only)
    edits: list[Edit]
    boundaries: list[Boundary]
    producers: dict[int, list[ir.Node]]  # group -> the nodes that start it

    def costly(self, group: int) -> bool:
        """Whether the group's order is undone inside the graph: a Gather there costs a pass
        over the activation (on a convolution's, ONNX Runtime also leaves its blocked layout;
        on a transformer's last axis, it gathers element by element: 20-30% on bert-tiny)."""
        return any(b.users for b in self.boundaries if b.group == group)


def _rank(v: ir.Value) -> int | None:
    return None if v.shape is None else len(v.shape)


class Walk:
    """One walk over the main graph: the groups (a union-find over producers), each permuted
    value's (group, negative axis), the edits and the boundaries; the handlers' working state."""

    def __init__(self, graph: ir.Graph, excluded: set[ir.Node]):
        self.graph = graph
        self.excluded = excluded
        self.state: dict[ir.Value, tuple[int, int]] = {}  # value -> (group, negative axis)
        self.parent: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.edits: list[Edit] = []
        self.producers: dict[int, list[ir.Node]] = {}
        self.bounds: dict[tuple[ir.Value, int], Boundary] = {}
        self.pending: list[Edit] = []
        self.joins: list[tuple[int, int]] = []
        self.ranks: dict[ir.Value, int] = {}
        self.flat: dict[ir.Value, int] = {}  # value -> a negative axis where its size is 1

    def rank(self, v: ir.Value | None) -> int | None:
        if v is None:
            return None
        return _rank(v) if v.shape is not None else self.ranks.get(v)

    def dim(self, v: ir.Value | None, axis: int) -> int | None:
        """``v``'s size on negative ``axis`` (1 when it has no such axis: it broadcasts)."""
        if v is None or self.flat.get(v) == axis:
            return 1
        r = self.rank(v)
        if r is None:
            return None
        if r < -axis:
            return 1
        if v.shape is None:
            return None
        d = v.shape[axis]
        return d if isinstance(d, int) else None

    def _infer_rank(self, node: ir.Node) -> None:
        """Ranks (and size-1 axes) the shape inference left out, for the handlers."""
        out = node.outputs[0] if node.outputs else None
        if out is None:
            return
        ranks = [self.rank(v) for v in node.inputs if v is not None]
        op = node.op_type
        r = None
        if op in ELEMENTWISE:
            for axis in {self.flat[v] for v in node.inputs if v in self.flat}:
                if all(self.dim(v, axis) == 1 for v in node.inputs if v is not None):
                    self.flat[out] = axis
        if op in ELEMENTWISE and ranks and None not in ranks:
            r = max(ranks)
        elif op in REDUCTIONS and ranks and attr(node, "keepdims", 1):
            r = ranks[0]
        elif op in SAME_RANK and ranks:
            r = ranks[0]
        elif op == "MatMul" and len(ranks) == 2 and None not in ranks and min(ranks) >= 2:
            r = max(ranks)
        elif op in ("Gemm", "Flatten"):
            r = 2
        elif op in ("Shape", "Size"):
            r = 1 if op == "Shape" else 0
        elif op == "Gather" and len(ranks) == 2 and None not in ranks:
            r = ranks[0] + ranks[1] - 1
        elif op == "Reshape" and len(node.inputs) > 1 and node.inputs[1] is not None:
            shape = node.inputs[1].shape
            if shape is not None and len(shape) == 1 and isinstance(shape[0], int):
                r = shape[0]
        if r is not None and out.shape is None:
            self.ranks[out] = r

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def new_group(self, n: int, node: ir.Node) -> int:
        g = len(self.parent)
        self.parent[g], self.size[g] = g, n
        self.producers[g] = [node]
        return g

    def n(self, g: int) -> int:
        return self.size[self.find(g)]

    def bound(self, value: ir.Value, user: ir.Node | None) -> None:
        g, axis = self.state[value]
        b = self.bounds.setdefault((value, axis), Boundary(value, g, axis, rank=self.rank(value)))
        if user is None:
            b.output = True
        elif user not in b.users:
            b.users.append(user)

    # the handlers' tools: pending edits and joins, committed when the handler succeeds
    def edit(self, node: ir.Node, index: int, axis: int, group: int) -> None:
        if const_array(node.inputs[index]) is None:
            raise Refused
        self.pending.append(Edit(node, index, axis, group))

    def join(self, a: int, b: int) -> None:
        if self.n(a) != self.n(b):
            raise Refused
        self.joins.append((a, b))

    def run(self) -> Plan:
        for node in self.graph:
            self._infer_rank(node)
            permuted = [
                (i, v) for i, v in enumerate(node.inputs) if v is not None and v in self.state
            ]
            if permuted:
                self._consume(node, permuted)
            if node not in self.excluded and node.domain in DEFAULT:
                start = PRODUCERS.get(node.op_type)
                if start is not None and node.outputs[0] not in self.state:
                    self.pending = []
                    found = start(self, node)
                    if found is not None:
                        n, axis, edits = found
                        g = self.new_group(n, node)
                        self.edits += [Edit(node, i, a, g) for i, a in edits]
                        self.state[node.outputs[0]] = (g, axis)
        for value in list(self.state):
            if value.is_graph_output():
                self.bound(value, None)
            for use in value.uses():
                if use.node.graph is not self.graph:  # read inside a subgraph
                    self.bound(value, use.node)
        roots = {g for g in self.parent if self.find(g) == g}
        producers: dict[int, list[ir.Node]] = {g: [] for g in roots}
        for g, nodes in self.producers.items():
            producers[self.find(g)] += nodes
        edits = [Edit(e.node, e.index, e.axis, self.find(e.group)) for e in self.edits]
        bounds = list(self.bounds.values())
        for b in bounds:
            b.group = self.find(b.group)
        return Plan({g: self.size[g] for g in roots}, edits, bounds, producers)

    def _consume(self, node: ir.Node, permuted: list[tuple[int, ir.Value]]) -> None:
        handler = HANDLERS.get(node.op_type) if node.domain in DEFAULT else None
        self.pending, self.joins = [], []
        outputs = None
        if handler is not None:
            try:
                outputs = handler(self, node, [(i, v, *self.state[v]) for i, v in permuted])
            except Refused:
                outputs = None
        if outputs is None:
            for _, v in permuted:
                self.bound(v, node)
            return
        for a, b in self.joins:
            ra, rb = self.find(a), self.find(b)
            if ra != rb:
                self.parent[rb] = ra
        self.edits += self.pending
        for index, st in outputs.items():
            if len(node.outputs) > index:
                self.state[node.outputs[index]] = st
        for index, out in enumerate(node.outputs):  # outputs the handler does not carry
            if index not in outputs and out.uses() and index in carried(node):
                for _, v in permuted:
                    self.bound(v, node)


def plan(graph: ir.Graph, *, rounds: int = 8) -> Plan:
    """The channel groups of ``graph``'s main graph. A group whose order would be undone inside
    the graph at a cost (``Plan.costly``) is given up (its producers excluded, the walk
    repeated) when every producer's weight is permuted on its input axis by another group, so
    that giving it up leaves no weight unpermuted."""
    excluded: set[ir.Node] = set()
    for _ in range(rounds):
        result = Walk(graph, excluded).run()
        drop = set()
        for g, nodes in result.producers.items():
            if not result.costly(g):
                continue
            inputs = {(e.node, e.index) for e in result.edits if e.group != g}
            if all((p, 0 if p.op_type == "Gather" else 1) in inputs for p in nodes):
                drop.update(nodes)
        if not drop:
            return result
        excluded |= drop
    return result
