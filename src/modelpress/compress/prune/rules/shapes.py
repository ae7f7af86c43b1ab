"""Rules for ops that move or reshape data: Transpose, Reshape and its kin (``regroup``), Concat,
Split, Slice, Gather, reductions, Pad, Resize, Expand, Tile, and the shape readers. A reshape
that splits or merges the units' axis regroups them; a shape constant that counts the units (a
Reshape target, Split sizes, an Expand shape) is recorded as an ``Edit`` (``target_site``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import onnx_ir as ir

from modelpress.compress.prune.depgraph import SMALL_INTS, Track, param
from modelpress.compress.prune.registry import Refuse, norm_axis, rule
from modelpress.ir.match import REDUCTIONS, attr, const_array, ints_arg, slice_params

if TYPE_CHECKING:
    from modelpress.compress.prune.analyzer import Analyzer


@rule("Transpose")
def _transpose(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    perm = list(attr(node, "perm", None) or reversed(range(rank)))
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
        if element == 0 and not int(attr(node, "allowzero", 0)):
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
    axis = norm_axis(int(attr(node, "axis", 0)), rank)
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
    axis = norm_axis(int(attr(node, "axis", 0)), rank)
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
        if norm_axis(ax, len(sx)) == t.axis and not (st == 1 and s <= 0 and e >= sx[t.axis]):
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
    axis = norm_axis(int(attr(node, "axis", 0)), len(a.shape(x)))
    if axis == t.axis:
        raise Refuse
    out = t.axis if t.axis < axis else t.axis + len(a.shape(idx)) - 1
    a.new(y, out, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


@rule(*REDUCTIONS, "ArgMax", "ArgMin")
def _reduce(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [int(attr(node, "axis", 0))]
    elif "axes" in node.attributes:
        axes = list(node.attributes["axes"].value)
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        if arr is None:
            raise Refuse
        axes = [int(v) for v in arr.reshape(-1)]
    else:
        axes = []
    axes = [norm_axis(ax, rank) for ax in axes] or list(range(rank))
    if t.axis in axes:
        raise Refuse  # a reduction over the units: removing one changes every result
    keep = int(attr(node, "keepdims", 1))
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
        axes = [norm_axis(int(v), rank) for v in arr.reshape(-1)]
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
