"""Channel groups: which activations of a graph may carry one hidden permutation of a channel axis
with no operator between the layers to undo it (the analysis ``mixing`` plans its rewrite on).

A layer that computes its output channels from slices of a constant weight (Conv, MatMul, Gemm,
an embedding Gather: a *producer*) can compute them in any order, the weight's output axis
permuted. That order then travels with the activation through every operator that treats the
channels of the axis alike (``_HANDLERS``):

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

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.protect.compress_graph import is_constant

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


class _Refused(Exception):
    """The node cannot carry its inputs' permutation: they are put back in order before it."""


def const_array(value: ir.Value | None) -> np.ndarray | None:
    if value is None or not is_constant(value):
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _rank(v: ir.Value) -> int | None:
    return None if v.shape is None else len(v.shape)


def _ints(node: ir.Node, name: str, index: int) -> list[int] | None:
    """An int list given as attribute ``name`` or as constant input ``index``."""
    attr = node.attributes.get(name)
    if attr is not None:
        return list(attr.value)
    if len(node.inputs) > index and node.inputs[index] is not None:
        a = const_array(node.inputs[index])
        return None if a is None else [int(x) for x in a.reshape(-1)]
    return None


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


class _Walk:
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
        if op in _ELEMENTWISE:
            for axis in {self.flat[v] for v in node.inputs if v in self.flat}:
                if all(self.dim(v, axis) == 1 for v in node.inputs if v is not None):
                    self.flat[out] = axis
        if op in _ELEMENTWISE and ranks and None not in ranks:
            r = max(ranks)
        elif op in _REDUCE and ranks and _attr(node, "keepdims", 1):
            r = ranks[0]
        elif op in _SAME_RANK and ranks:
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
            raise _Refused
        self.pending.append(Edit(node, index, axis, group))

    def join(self, a: int, b: int) -> None:
        if self.n(a) != self.n(b):
            raise _Refused
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
                start = _PRODUCERS.get(node.op_type)
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
        handler = _HANDLERS.get(node.op_type) if node.domain in DEFAULT else None
        self.pending, self.joins = [], []
        outputs = None
        if handler is not None:
            try:
                outputs = handler(self, node, [(i, v, *self.state[v]) for i, v in permuted])
            except _Refused:
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
            if index not in outputs and out.uses() and index in _carried(node):
                for _, v in permuted:
                    self.bound(v, node)


def _carried(node: ir.Node) -> set[int]:
    """Outputs that would depend on the channel order if the handler gave them no state: the
    handlers return every output they do not refuse, so only MaxPool's indices are checked."""
    return {1} if node.op_type == "MaxPool" else set()


# -- consumers ---------------------------------------------------------------------------------
Handler = Callable[[_Walk, ir.Node, list[tuple[int, ir.Value, int, int]]], dict | None]


def _broadcast(w: _Walk, node: ir.Node, permuted, *, only: set[int] | None = None) -> tuple:
    """Every permuted input on one axis; the other inputs broadcast there or are constants
    permuted along it. Returns ``(group, axis)``."""
    _, _, g, axis = permuted[0]
    n = w.n(g)
    for _, _, g2, a2 in permuted[1:]:
        if a2 != axis:
            raise _Refused
        w.join(g, g2)
    carried = {i for i, *_ in permuted}
    for i, v in enumerate(node.inputs):
        if v is None or i in carried or (only is not None and i not in only):
            continue
        d = w.dim(v, axis)
        if d == 1:
            continue
        if d != n:
            raise _Refused
        w.edit(node, i, w.rank(v) + axis, g)
    return g, axis


def _elementwise(w, node, permuted):
    st = _broadcast(w, node, permuted)
    return {i: st for i in range(len(node.outputs))}


def _channel_axis(w, v: ir.Value, axis: int) -> None:
    r = w.rank(v)
    if r is None or r < 2 or r + axis != 1:
        raise _Refused


def _normalization(count: int):
    def handle(w, node, permuted):
        (i, v, g, axis), *rest = permuted
        if i != 0 or rest:
            raise _Refused
        _channel_axis(w, v, axis)
        for k in range(1, count + 1):
            w.edit(node, k, 0, g)
        if any(o.uses() for o in node.outputs[1:]):
            raise _Refused
        return {0: (g, axis)}

    return handle


def _layer_norm(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None:
        raise _Refused
    start = _attr(node, "axis", -1) % r
    if r + axis < start:  # normalized over later axes only: the parameters do not see it
        return {k: (g, axis) for k in range(len(node.outputs))}
    if start != r - 1:
        raise _Refused
    _broadcast(w, node, [(i, v, g, axis)], only={1, 2})
    return {0: (g, axis)}


def _conv(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    if i != 0 or rest:
        raise _Refused
    _channel_axis(w, v, axis)
    weight = const_array(node.inputs[1])
    if weight is None:
        raise _Refused
    groups, n = _attr(node, "group", 1), w.n(g)
    if groups == 1:
        w.edit(node, 1, 1, g)
        return {}
    if groups == n and weight.shape[0] == n and weight.shape[1] == 1:  # depthwise
        w.edit(node, 1, 0, g)
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            w.edit(node, 2, 0, g)
        return {0: (g, axis)}
    raise _Refused


def _matmul(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    weight = const_array(node.inputs[1])
    if i != 0 or rest or weight is None or weight.ndim != 2:
        raise _Refused
    if axis == -1:
        w.edit(node, 1, 0, g)
        return {}
    if axis < -2:  # a batch axis
        return {0: (g, axis)}
    raise _Refused


def _gemm(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    weight = const_array(node.inputs[1])
    if i != 0 or rest or weight is None or axis != -1 or _attr(node, "transA", 0):
        raise _Refused
    w.edit(node, 1, 1 if _attr(node, "transB", 0) else 0, g)
    return {}


def _gather(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r, k = w.rank(v), w.rank(node.inputs[1])
    if i != 0 or rest or r is None or k is None:
        raise _Refused
    at, pa = _attr(node, "axis", 0) % r, r + axis
    if at == pa:
        raise _Refused
    out = pa if pa < at else pa + k - 1
    return {0: (g, out - (r + k - 1))}


def _reduce(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest:
        raise _Refused
    axes = _ints(node, "axes", 1)
    if axes is None or not axes:
        if axes is not None and _attr(node, "noop_with_empty_axes", 0):
            return {0: (g, axis)}
        if len(node.inputs) > 1 and node.inputs[1] is not None and axes is None:
            raise _Refused  # axes computed at run time
        return {}  # every axis: the order does not matter
    if any(a >= 0 for a in axes):
        if r is None:
            raise _Refused
        axes = [a - r if a >= 0 else a for a in axes]
    keep = _attr(node, "keepdims", 1)
    if axis in axes:
        if keep:
            w.flat[node.outputs[0]] = axis
        return {}
    if keep:
        return {0: (g, axis)}
    return {0: (g, axis + sum(a > axis for a in axes))}


def _pool(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    if i != 0 or rest:
        raise _Refused
    _channel_axis(w, v, axis)
    if len(node.outputs) > 1 and node.outputs[1].uses():
        raise _Refused  # MaxPool's indices count channels
    return {0: (g, axis)}


def _transpose(w, node, permuted):
    (i, v, g, axis), *_ = permuted
    r = w.rank(v)
    if r is None:
        raise _Refused
    perm = list(_attr(node, "perm", list(range(r))[::-1]))
    return {0: (g, perm.index(r + axis) - r)}


def _same_product(a: list, b: list) -> bool:
    def split(dims):
        ints = [d for d in dims if isinstance(d, int)]
        syms = sorted(str(d) for d in dims if not isinstance(d, int))
        return int(np.prod(ints)) if ints else 1, syms

    if any(d is None or (not isinstance(d, int) and str(d) in ("", "None")) for d in a + b):
        return False
    return split(a) == split(b)


def _reshape_like(w, node, permuted):
    """Reshape, Flatten, Squeeze, Unsqueeze: the axis stays whole when the output has an axis of
    its size with the same product of dimensions before it."""
    (i, v, g, axis), *rest = permuted
    out = node.outputs[0]
    if i != 0 or rest or v.shape is None or out.shape is None:
        raise _Refused
    dims, out_dims = list(v.shape), list(out.shape)
    pa, n = len(dims) + axis, w.n(g)
    for j, d in enumerate(out_dims):
        if d == n and _same_product(dims[:pa], out_dims[:j]):
            return {0: (g, j - len(out_dims))}
    raise _Refused


def _pad(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None or (len(node.inputs) > 3 and node.inputs[3] is not None):
        raise _Refused
    pads = _ints(node, "pads", 1)
    pa = r + axis
    if pads is None or len(pads) != 2 * r or pads[pa] or pads[pa + r]:
        raise _Refused
    return {0: (g, axis)}


def _slice(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None:
        raise _Refused
    starts = _ints(node, "starts", 1)
    axes = _ints(node, "axes", 3)
    if starts is None or (axes is None and len(node.inputs) > 3 and node.inputs[3] is not None):
        raise _Refused
    axes = list(range(len(starts))) if axes is None else axes
    if (r + axis) in [a % r for a in axes]:
        raise _Refused
    return {0: (g, axis)}


_UNARY = """Relu LeakyRelu Elu Selu Celu Sigmoid HardSigmoid Tanh Erf Gelu HardSwish Mish Softplus
Softsign Exp Log Abs Neg Sqrt Reciprocal Floor Ceil Round Sign Sin Cos Identity Cast Dropout
IsNaN IsInf Not ThresholdedRelu Shrink Clip""".split()
_BINARY = """Add Sub Mul Div Pow Max Min Sum Mean Where PRelu Equal Less Greater LessOrEqual
GreaterOrEqual And Or Xor BitShift Mod""".split()
_REDUCE = """ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceSumSquare
ReduceLogSum ReduceLogSumExp""".split()

_ELEMENTWISE = set(_UNARY + _BINARY)
_SAME_RANK = {
    *"Transpose Softmax LogSoftmax LayerNormalization BatchNormalization Conv Pad Slice".split(),
    *"InstanceNormalization MaxPool AveragePool GlobalAveragePool GlobalMaxPool Erf".split(),
}

_HANDLERS: dict[str, Handler] = {
    "Shape": lambda w, node, p: {},  # the shape does not depend on the order
    "Size": lambda w, node, p: {},
    **{op: _elementwise for op in _UNARY + _BINARY},
    **{op: _reduce for op in _REDUCE},
    **{op: _pool for op in "MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool".split()},
    **{op: _reshape_like for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")},
    "GlobalLpPool": _pool,
    "BatchNormalization": _normalization(4),
    "InstanceNormalization": _normalization(2),
    "LayerNormalization": _layer_norm,
    "Softmax": lambda w, node, p: {0: p[0][2:]} if len(p) == 1 and p[0][0] == 0 else None,
    "LogSoftmax": lambda w, node, p: {0: p[0][2:]} if len(p) == 1 and p[0][0] == 0 else None,
    "Conv": _conv,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Gather": _gather,
    "Transpose": _transpose,
    "Pad": _pad,
    "Slice": _slice,
}


# -- producers: (channels, the output's negative axis, [(input, axis) of the weights]) -----------
def _start_conv(w, node):
    weight = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or weight.ndim < 3 or _attr(node, "group", 1) != 1:
        return None
    n = weight.shape[0]
    edits = [(1, 0)]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = const_array(node.inputs[2])
        if bias is None or bias.shape != (n,):
            return None
        edits.append((2, 0))
    return (n, 1 - weight.ndim, edits) if n >= 2 else None


def _start_matmul(w, node):
    weight = const_array(node.inputs[1])
    if weight is None or weight.ndim != 2 or weight.shape[1] < 2:
        return None
    return weight.shape[1], -1, [(1, 1)]


def _start_gemm(w, node):
    weight = const_array(node.inputs[1])
    if weight is None or weight.ndim != 2:
        return None
    trans = _attr(node, "transB", 0)
    n = weight.shape[0] if trans else weight.shape[1]
    edits = [(1, 0 if trans else 1)]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = const_array(node.inputs[2])
        if bias is None:
            return None
        if bias.shape[-1:] == (n,) and bias.size == n:
            edits.append((2, bias.ndim - 1))
        elif bias.size != 1:
            return None
    return (n, -1, edits) if n >= 2 else None


def _start_embedding(w, node):
    table = const_array(node.inputs[0])
    if table is None or table.ndim != 2 or _attr(node, "axis", 0) != 0 or table.shape[1] < 2:
        return None
    return table.shape[1], -1, [(0, 1)]


_PRODUCERS = {
    "Conv": _start_conv,
    "MatMul": _start_matmul,
    "Gemm": _start_gemm,
    "Gather": _start_embedding,
}


def plan(graph: ir.Graph, *, rounds: int = 8) -> Plan:
    """The channel groups of ``graph``'s main graph. A group whose order would be undone inside
    the graph at a cost (``Plan.costly``) is given up (its producers excluded, the walk
    repeated) when every producer's weight is permuted on its input axis by another group, so
    that giving it up leaves no weight unpermuted."""
    excluded: set[ir.Node] = set()
    for _ in range(rounds):
        result = _Walk(graph, excluded).run()
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
