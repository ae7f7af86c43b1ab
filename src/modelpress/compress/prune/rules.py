"""How units flow through each op: the rules of the dependency analysis (see ``depgraph.py``).

A rule reads its node's inputs' tracks and concrete shapes, gives its outputs tracks, joins units
that must be removed together, and records the constant entries (``Slice``) and shape constants
(``Edit``) each unit owns. A rule that cannot follow its input raises ``Refuse``: every unit of its
tracked inputs is then blocked (kept), which is always safe. Ops without a rule block too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune.registry import Refuse, rule

if TYPE_CHECKING:
    from modelpress.compress.prune.analyzer import Analyzer
from modelpress.compress.prune.depgraph import SMALL_INTS, Track, param
from modelpress.ir.match import const_array, ints_arg, slice_params


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _bias(a: Analyzer, node: ir.Node, index: int, y: ir.Value, n: int) -> None:
    """A bias-like constant input broadcast against ``y``'s last axis of length ``n``."""
    if index >= len(node.inputs) or node.inputs[index] is None:
        return
    c = param(node.inputs[index])
    if c is None:
        raise Refuse
    if c.size <= 1 or c.shape[-1] == 1:
        return
    if c.shape[-1] != n:
        raise Refuse
    a.slice(node, index, c.ndim - 1, y, "bias")


# sources -------------------------------------------------------------------------------------
@rule("Conv")
def _conv(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = param(w)
    tx = a.track(x)
    if weights is None or weights.ndim < 3:
        raise Refuse
    group = int(_attr(node, "group", 1))
    cout, cig = weights.shape[0], weights.shape[1]
    cin = cig * group
    if tx is not None and tx.axis != 1:
        raise Refuse
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    if group > 1 and group == cin:
        # depthwise (channel multiplier cout / cin): output channels follow their input channel
        if tx is None:
            return
        a.new(y, 1, tx.units, kind=a.g.kinds.get(x.name))
        a.link(x, y)
        a.slice(node, 1, 0, y, "weight")
        if has_bias:
            a.slice(node, 2, 0, y, "bias")
        a.edit(node, "group", x)
        return
    if tx is not None:
        if group == 1:
            a.slice(node, 1, 1, x, "weight")
        else:
            # grouped: every group reads its own channels through the same weight columns, so
            # local input channel j goes from every group at once
            if tx.block != 1:
                raise Refuse
            for u in range(tx.units):
                a.g.uf.union((x.name, u), (x.name, u % cig))
            a.slice(node, 1, 1, x, "weight", modulus=cig)
    a.new(y, 1, cout, source=node, kind="channels")
    a.slice(node, 1, 0, y, "weight")
    if has_bias:
        a.slice(node, 2, 0, y, "bias")
    if group > 1:
        cog = cout // group
        for o in range(cout):
            a.g.uf.union((y.name, o), (y.name, o % cog))


@rule("ConvTranspose")
def _conv_transpose(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    weights = param(node.inputs[1])
    if weights is None or int(_attr(node, "group", 1)) != 1:
        raise Refuse
    tx = a.track(x)
    if tx is not None:
        if tx.axis != 1:
            raise Refuse
        a.slice(node, 1, 0, x, "weight")
    a.new(y, 1, weights.shape[1], source=node, kind="channels")
    a.slice(node, 1, 1, y, "weight")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        a.slice(node, 2, 0, y, "bias")


@rule("Gemm")
def _gemm(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = param(w)
    tx = a.track(x)
    if weights is None or weights.ndim != 2 or param(x) is not None:
        raise Refuse
    trans_a, trans_b = int(_attr(node, "transA", 0)), int(_attr(node, "transB", 0))
    if tx is not None:
        if tx.axis != (0 if trans_a else 1):
            raise Refuse
        a.slice(node, 1, 1 if trans_b else 0, x, "weight")
    n = weights.shape[0 if trans_b else 1]
    a.new(y, 1, n, source=node, kind="neurons")
    a.slice(node, 1, 0 if trans_b else 1, y, "weight")
    _bias(a, node, 2, y, n)


@rule("MatMul")
def _matmul(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    wx, ww = param(x), param(w)
    if wx is not None:
        raise Refuse  # a constant left operand: rare, not followed
    if ww is None:
        _matmul_activations(a, node)
        return
    tx = a.track(x)
    sx, sy = a.shape(x), a.shape(y)
    if ww.ndim != 2 or len(sx) < 2:
        raise Refuse
    if tx is not None:
        if tx.axis == len(sx) - 1:
            a.slice(node, 1, 0, x, "weight")
        else:  # rows (tokens, batch): they pass through; the features are then not a source
            a.new(y, tx.axis + len(sy) - len(sx), tx.units, kind=a.g.kinds.get(x.name))
            a.link(x, y)
            return
    a.new(y, len(sy) - 1, ww.shape[1], source=node, kind="neurons")
    a.slice(node, 1, 1, y, "weight")


def _matmul_activations(a: Analyzer, node: ir.Node) -> None:
    """A product of two computed tensors (attention: Q·Kᵀ, P·V). Contracted units are joined;
    batch axes (the heads) are joined across both operands and carried to the output."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    sx, sw, sy = a.shape(x), a.shape(w), a.shape(y)
    rx, rw, r = len(sx), len(sw), len(sy)
    if rx < 2 or rw < 2:
        raise Refuse
    tx, tw = a.track(x), a.track(w)
    out = None  # (axis, units, [values to link])
    if tx is not None and tx.axis == rx - 1:
        if tw is None or tw.axis != rw - 2:
            raise Refuse
        a.link(x, w)
        tx = None
        if tw is not None:
            tw = None
    elif tw is not None and tw.axis == rw - 2:
        raise Refuse
    for t, v, rank, other, other_shape, other_rank in (
        (tx, x, rx, w, sw, rw),
        (tw, w, rw, x, sx, rx),
    ):
        if t is None:
            continue
        oa = t.axis + r - rank
        if t.axis < rank - 2:  # a batch axis: the other operand must agree or broadcast
            k = oa - (r - other_rank)
            to = a.track(other)
            if 0 <= k < other_rank - 2:
                if to is not None and to.axis == k:
                    a.link(v, other)
                elif other_shape[k] != 1:
                    raise Refuse
            a.g.kinds[v.name] = "heads"
        if out is None:
            out = (oa, t.units, [v])
        elif out[0] == oa:
            out[2].append(v)
        else:
            raise Refuse
    if out is not None:
        a.new(
            y,
            out[0],
            out[1],
            kind="heads" if any(a.g.kinds.get(v.name) == "heads" for v in out[2]) else None,
        )
        for v in out[2]:
            a.link(v, y)


# pass-through ---------------------------------------------------------------------------------
_UNARY = (
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Softplus",
    "Softsign",
    "Gelu",
    "Erf",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Abs",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
    "Cos",
    "Sin",
    "Not",
    "Identity",
    "Dropout",
    "Cast",
    "CastLike",
    "Clip",
    "IsNaN",
    "IsInf",
    "Mish",
    "ThresholdedRelu",
    "Shrink",
)


@rule(*_UNARY)
def _unary(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    if t is None:
        raise Refuse
    for v in node.inputs[1:]:  # Clip bounds, CastLike's example: scalars or types only
        if v is not None and v.name in a.g.tracks:
            raise Refuse
        if v is not None and node.op_type == "Clip" and int(np.prod(a.shape(v))) > 1:
            raise Refuse
    a.new(y, t.axis, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


@rule("QuantizeLinear", "DequantizeLinear")
def _qdq(a: Analyzer, node: ir.Node) -> None:
    for v in node.inputs[1:]:
        if v is not None and int(np.prod(a.shape(v))) > 1:
            raise Refuse  # per-channel parameters are not followed
    _unary(a, node)


@rule("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _pool(a: Analyzer, node: ir.Node) -> None:
    t = a.track(node.inputs[0])
    if (
        t is None
        or t.axis != 1
        or (len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses())
    ):
        raise Refuse
    _unary(a, node)


@rule("BatchNormalization", "InstanceNormalization")
def _channel_norm(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    if (
        t is None
        or t.axis != 1
        or any(o is not None and o.name and o.uses() for o in node.outputs[1:])
    ):
        raise Refuse
    a.new(y, 1, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)
    roles = ["scale", "shift", "stat", "stat"]
    for i in range(1, len(node.inputs)):
        if node.inputs[i] is not None:
            a.slice(node, i, 0, y, roles[i - 1])


@rule("LayerNormalization")
def _layer_norm(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    axis = _norm_axis(int(_attr(node, "axis", -1)), rank)
    if t is None or any(o is not None and o.name and o.uses() for o in node.outputs[1:]):
        raise Refuse
    a.new(y, t.axis, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)
    if t.axis >= axis:  # the normalized features themselves: their scale and bias follow them
        for i in (1, 2):
            if i < len(node.inputs) and node.inputs[i] is not None:
                p = param(node.inputs[i])
                if p is None:
                    raise Refuse
                # the parameter broadcasts against x.shape[axis:], aligned to the right
                k = t.axis - rank + p.ndim
                if 0 <= k < p.ndim and p.shape[k] != 1:
                    a.slice(node, i, k, y, "norm")


@rule("Softmax", "LogSoftmax", "Hardmax")
def _softmax(a: Analyzer, node: ir.Node) -> None:
    t = a.track(node.inputs[0])
    rank = len(a.shape(node.inputs[0]))
    opset = a.model.opset_imports.get("", a.model.opset_imports.get("ai.onnx", 13))
    axis = _norm_axis(int(_attr(node, "axis", -1 if opset >= 13 else 1)), rank)
    old_style = opset < 13
    if t is None or t.axis == axis or (old_style and t.axis >= axis):
        raise Refuse  # a normalization across the units themselves
    _unary(a, node)


_ELEMENTWISE = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Mean",
    "Sum",
    "Where",
    "PRelu",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "And",
    "Or",
    "Xor",
    "Mod",
    "BitShift",
)


@rule(*_ELEMENTWISE)
def _elementwise(a: Analyzer, node: ir.Node) -> None:
    y = node.outputs[0]
    r = len(a.shape(y))
    out_axis, units = None, None
    tracked = []
    for v in node.inputs:
        t = a.track(v)
        if t is None:
            continue
        ax = t.axis + r - len(a.shape(v))
        if out_axis is None:
            out_axis, units = ax, t.units
        elif ax != out_axis or t.units != units:
            raise Refuse
        tracked.append(v)
    kind = next((a.g.kinds.get(v.name) for v in tracked if a.g.kinds.get(v.name)), None)
    a.new(y, out_axis, units, kind=kind)
    for v in tracked:
        a.link(v, y)
    for i, v in enumerate(node.inputs):
        if v is None or v.name in a.g.tracks:
            continue
        sv = a.shape(v)
        k = out_axis - (r - len(sv))
        if k < 0 or sv[k] == 1:
            continue
        if param(v) is None:
            raise Refuse  # a computed tensor with channels nobody tracks
        a.slice(node, i, k, y, "param")


@rule("Transpose")
def _transpose(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    perm = list(_attr(node, "perm", None) or reversed(range(rank)))
    a.new(y, perm.index(t.axis), t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


def regroup(sx: tuple[int, ...], sy: tuple[int, ...], t: Track) -> tuple[int, int]:
    """Where a reshape from ``sx`` to ``sy`` takes the units of track ``t``: ``(axis, units)``.

    Row-major order is kept, so input and output axes fall into groups of equal products. The
    tracked axis must lead its group (else its blocks interleave with other axes). Its units land
    on the group's first output axis longer than 1, in blocks that hold whole rows of the axes
    after it; when a block would cut a row, neighbouring units merge (head splits: 384 features
    into 12 heads of 32).
    """

    def prefix(shape):
        out = [1]
        for d in shape:
            out.append(out[-1] * d)
        return out

    px, py = prefix(sx), prefix(sy)
    if px[-1] != py[-1]:
        raise Refuse
    common = set(px) & set(py)
    i0 = max(i for i in range(t.axis + 1) if px[i] in common)
    i1 = min(i for i in range(t.axis + 1, len(sx) + 1) if px[i] in common and px[i] > px[t.axis])
    if px[i0] != px[t.axis]:
        raise Refuse  # axes before the tracked one in its group: units would interleave
    j0 = max(j for j in range(len(py)) if py[j] == px[i0])
    j1 = min(j for j in range(len(py)) if py[j] == px[i1])
    span = t.block * math.prod(sx[t.axis + 1 : i1])  # elements of one unit in the group
    o = next(j for j in range(j0, j1) if sy[j] > 1)
    row = math.prod(sy[o + 1 : j1])
    merged = span * row // math.gcd(span, row)
    factor = merged // span
    if t.units % factor:
        raise Refuse
    return o, t.units // factor


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    sx, sy = a.shape(x), a.shape(y)
    o, units = regroup(sx, sy, t)
    factor = t.units // units
    if factor > 1:
        for u in range(t.units):
            a.g.uf.union((x.name, u), (x.name, (u // factor) * factor))
    a.new(y, o, units, kind=a.g.kinds.get(x.name))
    for u in range(units):
        a.g.uf.union((y.name, u), (x.name, u * factor))
    if node.op_type == "Reshape":
        site = target_site(node.inputs[1], o, a.shapes)
        if site == "dynamic":
            return  # computed from shapes at run time: it follows the pruned tensors itself
        if site is None:
            raise Refuse
        value, offset = site
        element = int(const_array(value).reshape(-1)[offset])
        if element == -1:
            return
        if element == 0 and not int(_attr(node, "allowzero", 0)):
            if not (o == t.axis and sx[o] == sy[o]):
                raise Refuse
            return
        a.edit(node, "reshape", y, o)


def target_site(
    value: ir.Value | None, index: int, shapes: dict
) -> tuple[ir.Value, int] | str | None:
    """The constant holding element ``index`` of a 1-D shape tensor: ``(value, offset)``, through
    Concats of pieces; ``"dynamic"`` when that element is computed; None when it cannot be told."""
    if value is None:
        return None
    if const_array(value) is not None:
        return value, index
    node = value.producer()
    if node is None or node.op_type != "Concat":
        return "dynamic"
    offset = 0
    for piece in node.inputs:
        arr = const_array(piece)
        n = arr.size if arr is not None else (shapes.get(piece.name, (None,)) or (None,))[0]
        if n is None:
            return None
        if index < offset + n:
            return target_site(piece, index - offset, shapes)
        offset += n
    return None


@rule("Concat")
def _concat(a: Analyzer, node: ir.Node) -> None:
    y = node.outputs[0]
    rank = len(a.shape(y))
    axis = _norm_axis(int(_attr(node, "axis", 0)), rank)
    tracks = [(v, a.track(v)) for v in node.inputs]
    tracked = [(v, t) for v, t in tracks if t is not None]
    if any(t.axis != tracked[0][1].axis for _, t in tracked):
        raise Refuse
    if tracked[0][1].axis != axis:  # joined along another axis: every part carries the same units
        t0 = tracked[0][1]
        a.new(y, t0.axis, t0.units, kind=a.g.kinds.get(tracked[0][0].name))
        for v, _t in tracked:
            a.link(v, y)
        for i, (v, t) in enumerate(tracks):
            if t is None:
                if param(v) is None:
                    raise Refuse
                a.slice(node, i, t0.axis, y, "param")
        return
    block = tracked[0][1].block
    if any(t.block != block for _, t in tracked):
        raise Refuse
    total = 0
    parts = []
    for v, t in tracks:
        n = a.shape(v)[axis]
        if n % block:
            raise Refuse
        parts.append((v, t, total, n // block))
        total += n // block
    a.new(
        y,
        axis,
        total,
        kind=next((a.g.kinds.get(v.name) for v, _ in tracked if a.g.kinds.get(v.name)), None),
    )
    for v, t, start, count in parts:
        if t is not None:
            for u in range(count):
                a.g.uf.union((y.name, start + u), (v.name, u))
        else:  # an untracked part keeps its channels
            a.blocked_keys.update((y.name, start + u) for u in range(count))


@rule("Split")
def _split(a: Analyzer, node: ir.Node) -> None:
    x = node.inputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    axis = _norm_axis(int(_attr(node, "axis", 0)), rank)
    outs = [v for v in node.outputs]
    if axis != t.axis:
        for v in outs:
            a.new(v, t.axis, t.units, kind=a.g.kinds.get(x.name))
            a.link(x, v)
        return
    explicit = "split" in node.attributes or (len(node.inputs) > 1 and node.inputs[1] is not None)
    start = 0
    for i, v in enumerate(outs):
        n = a.shape(v)[axis]
        if n % t.block:
            raise Refuse
        count = n // t.block
        a.new(v, axis, count, kind=a.g.kinds.get(x.name))
        for u in range(count):
            a.g.uf.union((v.name, u), (x.name, start + u))
        start += count
        if explicit:
            a.edit(node, "split", v, i)
    if not explicit:  # equal parts: each keeps the same units, so unit k goes from every part
        for v in outs[1:]:
            a.link(outs[0], v)


@rule("Slice")
def _slice(a: Analyzer, node: ir.Node) -> None:

    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    params = slice_params(node)
    sx = a.shape(x)
    if params is None:
        raise Refuse
    starts, ends, axes, steps = params
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if _norm_axis(ax, len(sx)) == t.axis and not (st == 1 and s <= 0 and e >= sx[t.axis]):
            raise Refuse
    _unary_like(a, x, y, t)


def _unary_like(a: Analyzer, x: ir.Value, y: ir.Value, t: Track) -> None:
    a.new(y, t.axis, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


@rule("Gather")
def _gather(a: Analyzer, node: ir.Node) -> None:
    x, idx, y = node.inputs[0], node.inputs[1], node.outputs[0]
    t = a.track(x)
    if t is None or a.track(idx) is not None:
        raise Refuse
    axis = _norm_axis(int(_attr(node, "axis", 0)), len(a.shape(x)))
    if axis == t.axis:
        raise Refuse
    out = t.axis if t.axis < axis else t.axis + len(a.shape(idx)) - 1
    a.new(y, out, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


@rule(
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ArgMax",
    "ArgMin",
)
def _reduce(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [int(_attr(node, "axis", 0))]
    elif "axes" in node.attributes:
        axes = list(node.attributes["axes"].value)
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        if arr is None:
            raise Refuse
        axes = [int(v) for v in arr.reshape(-1)]
    else:
        axes = []
    axes = [_norm_axis(ax, rank) for ax in axes] or list(range(rank))
    if t.axis in axes:
        raise Refuse  # a reduction over the units: removing one changes every result
    keep = int(_attr(node, "keepdims", 1))
    _unary_like(
        a,
        x,
        y,
        Track(t.axis if keep else t.axis - sum(ax < t.axis for ax in axes), t.size, t.units),
    )


@rule("Pad")
def _pad(a: Analyzer, node: ir.Node) -> None:

    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    _, pads = ints_arg(node, "pads", 1)
    if pads is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        # computed by the exporter from constants: its probed value (channel pads do not depend
        # on the input's size)
        probed = a.shapes.get(SMALL_INTS, {}).get(node.inputs[1].name)
        pads = None if probed is None else [int(v) for v in probed]
    if pads is None:
        raise Refuse
    axes = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        arr = const_array(node.inputs[3])
        if arr is None:
            raise Refuse
        axes = [_norm_axis(int(v), rank) for v in arr.reshape(-1)]
    n = len(axes)
    for i, ax in enumerate(axes):
        if ax == t.axis and (pads[i] or pads[i + n]):
            raise Refuse
    _unary_like(a, x, y, t)


@rule("Resize", "Upsample")
def _resize(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    if a.shape(y)[t.axis] != t.size:
        raise Refuse
    sizes_index = 3 if node.op_type == "Resize" else None
    if (
        sizes_index is not None
        and len(node.inputs) > sizes_index
        and node.inputs[sizes_index] is not None
    ):
        raise Refuse  # target sizes name the channel count: not followed
    _unary_like(a, x, y, t)


@rule("Expand")
def _expand(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    out = t.axis + len(a.shape(y)) - len(a.shape(x))
    _unary_like(a, x, y, Track(out, t.size, t.units))
    site = target_site(node.inputs[1], out, a.shapes)
    if site == "dynamic":
        return
    if site is None:
        raise Refuse
    value, offset = site
    if int(const_array(value).reshape(-1)[offset]) != 1:
        a.edit(node, "expand", y, out)


@rule("Tile")
def _tile(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    reps = const_array(node.inputs[1])
    if reps is None or int(reps.reshape(-1)[t.axis]) != 1:
        raise Refuse
    _unary_like(a, x, y, t)


@rule("Shape", "Size")
def _shape_reader(a: Analyzer, node: ir.Node) -> None:
    """Reads only the shape, which follows the pruned tensor at run time."""


__all__ = ["regroup", "target_site"]
