"""What each operator does with a channel axis permuted by one hidden order (the analysis is
``channels``): a *handler* per op type carries the order through the node, puts it on the
node's constant operands, or refuses (``Refused``: the order is undone before the node); a
*producer* per op type starts a group from a constant weight it can permute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from modelpress.ir.match import BROADCASTING, GLOBAL_POOLS, REDUCTIONS
from modelpress.protect.compress_graph import is_constant

if TYPE_CHECKING:
    from modelpress.protect.channels import Walk


class Refused(Exception):
    """The node cannot carry its inputs' permutation: they are put back in order before it."""


def const_array(value: ir.Value | None) -> np.ndarray | None:
    if value is None or not is_constant(value):
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _ints(node: ir.Node, name: str, index: int) -> list[int] | None:
    """An int list given as attribute ``name`` or as constant input ``index``."""
    attr = node.attributes.get(name)
    if attr is not None:
        return list(attr.value)
    if len(node.inputs) > index and node.inputs[index] is not None:
        a = const_array(node.inputs[index])
        return None if a is None else [int(x) for x in a.reshape(-1)]
    return None


def attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def carried(node: ir.Node) -> set[int]:
    """Outputs that would depend on the channel order if the handler gave them no state: the
    handlers return every output they do not refuse, so only MaxPool's indices are checked."""
    return {1} if node.op_type == "MaxPool" else set()


# -- consumers: {output: (group, negative axis)} of the outputs that carry the order --------------------------------------------------------------------------------
Handler = Callable[["Walk", ir.Node, list[tuple[int, ir.Value, int, int]]], dict | None]


def _broadcast(w: Walk, node: ir.Node, permuted, *, only: set[int] | None = None) -> tuple:
    """Every permuted input on one axis; the other inputs broadcast there or are constants
    permuted along it. Returns ``(group, axis)``."""
    _, _, g, axis = permuted[0]
    n = w.n(g)
    for _, _, g2, a2 in permuted[1:]:
        if a2 != axis:
            raise Refused
        w.join(g, g2)
    carried = {i for i, *_ in permuted}
    for i, v in enumerate(node.inputs):
        if v is None or i in carried or (only is not None and i not in only):
            continue
        d = w.dim(v, axis)
        if d == 1:
            continue
        if d != n:
            raise Refused
        w.edit(node, i, w.rank(v) + axis, g)
    return g, axis


def _elementwise(w, node, permuted):
    st = _broadcast(w, node, permuted)
    return {i: st for i in range(len(node.outputs))}


def _channel_axis(w, v: ir.Value, axis: int) -> None:
    r = w.rank(v)
    if r is None or r < 2 or r + axis != 1:
        raise Refused


def _normalization(count: int):
    def handle(w, node, permuted):
        (i, v, g, axis), *rest = permuted
        if i != 0 or rest:
            raise Refused
        _channel_axis(w, v, axis)
        for k in range(1, count + 1):
            w.edit(node, k, 0, g)
        if any(o.uses() for o in node.outputs[1:]):
            raise Refused
        return {0: (g, axis)}

    return handle


def _layer_norm(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None:
        raise Refused
    start = attr(node, "axis", -1) % r
    if r + axis < start:  # normalized over later axes only: the parameters do not see it
        return {k: (g, axis) for k in range(len(node.outputs))}
    if start != r - 1:
        raise Refused
    _broadcast(w, node, [(i, v, g, axis)], only={1, 2})
    return {0: (g, axis)}


def _conv(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    if i != 0 or rest:
        raise Refused
    _channel_axis(w, v, axis)
    weight = const_array(node.inputs[1])
    if weight is None:
        raise Refused
    groups, n = attr(node, "group", 1), w.n(g)
    if groups == 1:
        w.edit(node, 1, 1, g)
        return {}
    if groups == n and weight.shape[0] == n and weight.shape[1] == 1:  # depthwise
        w.edit(node, 1, 0, g)
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            w.edit(node, 2, 0, g)
        return {0: (g, axis)}
    raise Refused


def _matmul(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    weight = const_array(node.inputs[1])
    if i != 0 or rest or weight is None or weight.ndim != 2:
        raise Refused
    if axis == -1:
        w.edit(node, 1, 0, g)
        return {}
    if axis < -2:  # a batch axis
        return {0: (g, axis)}
    raise Refused


def _gemm(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    weight = const_array(node.inputs[1])
    if i != 0 or rest or weight is None or axis != -1 or attr(node, "transA", 0):
        raise Refused
    w.edit(node, 1, 1 if attr(node, "transB", 0) else 0, g)
    return {}


def _gather(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r, k = w.rank(v), w.rank(node.inputs[1])
    if i != 0 or rest or r is None or k is None:
        raise Refused
    at, pa = attr(node, "axis", 0) % r, r + axis
    if at == pa:
        raise Refused
    out = pa if pa < at else pa + k - 1
    return {0: (g, out - (r + k - 1))}


def _reduce(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest:
        raise Refused
    axes = _ints(node, "axes", 1)
    if axes is None or not axes:
        if axes is not None and attr(node, "noop_with_empty_axes", 0):
            return {0: (g, axis)}
        if len(node.inputs) > 1 and node.inputs[1] is not None and axes is None:
            raise Refused  # axes computed at run time
        return {}  # every axis: the order does not matter
    if any(a >= 0 for a in axes):
        if r is None:
            raise Refused
        axes = [a - r if a >= 0 else a for a in axes]
    keep = attr(node, "keepdims", 1)
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
        raise Refused
    _channel_axis(w, v, axis)
    if len(node.outputs) > 1 and node.outputs[1].uses():
        raise Refused  # MaxPool's indices count channels
    return {0: (g, axis)}


def _transpose(w, node, permuted):
    (i, v, g, axis), *_ = permuted
    r = w.rank(v)
    if r is None:
        raise Refused
    perm = list(attr(node, "perm", list(range(r))[::-1]))
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
        raise Refused
    dims, out_dims = list(v.shape), list(out.shape)
    pa, n = len(dims) + axis, w.n(g)
    for j, d in enumerate(out_dims):
        if d == n and _same_product(dims[:pa], out_dims[:j]):
            return {0: (g, j - len(out_dims))}
    raise Refused


def _pad(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None or (len(node.inputs) > 3 and node.inputs[3] is not None):
        raise Refused
    pads = _ints(node, "pads", 1)
    pa = r + axis
    if pads is None or len(pads) != 2 * r or pads[pa] or pads[pa + r]:
        raise Refused
    return {0: (g, axis)}


def _slice(w, node, permuted):
    (i, v, g, axis), *rest = permuted
    r = w.rank(v)
    if i != 0 or rest or r is None:
        raise Refused
    starts = _ints(node, "starts", 1)
    axes = _ints(node, "axes", 3)
    if starts is None or (axes is None and len(node.inputs) > 3 and node.inputs[3] is not None):
        raise Refused
    axes = list(range(len(starts))) if axes is None else axes
    if (r + axis) in [a % r for a in axes]:
        raise Refused
    return {0: (g, axis)}


_UNARY = """Relu LeakyRelu Elu Selu Celu Sigmoid HardSigmoid Tanh Erf Gelu HardSwish Mish Softplus
Softsign Exp Log Abs Neg Sqrt Reciprocal Floor Ceil Round Sign Sin Cos Identity Cast Dropout
IsNaN IsInf Not ThresholdedRelu Shrink Clip""".split()

ELEMENTWISE = {*_UNARY, *BROADCASTING}
SAME_RANK = {
    *"Transpose Softmax LogSoftmax LayerNormalization BatchNormalization Conv Pad Slice".split(),
    *"InstanceNormalization MaxPool AveragePool Erf".split(),
    *GLOBAL_POOLS,
}

HANDLERS: dict[str, Handler] = {
    "Shape": lambda w, node, p: {},  # the shape does not depend on the order
    "Size": lambda w, node, p: {},
    **dict.fromkeys(ELEMENTWISE, _elementwise),
    **{op: _reduce for op in REDUCTIONS},
    **{op: _pool for op in ("MaxPool", "AveragePool", "LpPool", "GlobalLpPool", *GLOBAL_POOLS)},
    **{op: _reshape_like for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")},
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
    if weight is None or weight.ndim < 3 or attr(node, "group", 1) != 1:
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
    trans = attr(node, "transB", 0)
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
    if table is None or table.ndim != 2 or attr(node, "axis", 0) != 0 or table.shape[1] < 2:
        return None
    return table.shape[1], -1, [(0, 1)]


PRODUCERS = {
    "Conv": _start_conv,
    "MatMul": _start_matmul,
    "Gemm": _start_gemm,
    "Gather": _start_embedding,
}
