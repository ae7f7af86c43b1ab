"""Shape and layout ops: Shape, Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice,
Tile, Expand, Pad, ConstantOfShape, Range, DepthToSpace/SpaceToDepth, Trilu, EyeLike, CumSum.

Several of these took their axes/sizes as attributes in older opsets and as inputs since
(Reshape 5, Slice 10, Pad 11, Squeeze/Unsqueeze/Split 13); both forms are handled here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from modelpress.runtime.torch_backend.registry import axis_of, op, torch_dtype


def _shape_tensor(values, device):
    return torch.tensor(values, dtype=torch.int64, device=device)


@op("Shape")
def shape(ctx, x):
    dims = list(x.shape)
    start = ctx.attr("start", 0)
    end = ctx.attr("end")
    return _shape_tensor(dims[start:end], x.device)


@op("Size")
def size(ctx, x):
    return torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


@op("Reshape")
def reshape(ctx, x, target=None):
    dims = ctx.attr("shape") if ctx.opset < 5 else ctx.ints(1, target)
    if not ctx.attr("allowzero", 0):
        # 0 copies the input's dimension (unless allowzero says it means an empty dimension)
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@op("Flatten")
def flatten(ctx, x):
    axis = axis_of(ctx.attr("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op("Squeeze")
def squeeze(ctx, x, axes=None):
    axes = ctx.attr("axes") if ctx.opset < 13 else ctx.ints(1, axes)
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    axes = {axis_of(a, x.dim()) for a in axes}
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@op("Unsqueeze")
def unsqueeze(ctx, x, axes=None):
    axes = ctx.attr("axes") if ctx.opset < 13 else ctx.ints(1, axes)
    rank = x.dim() + len(axes)
    axes = sorted(axis_of(a, rank) for a in axes)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return x.reshape(dims)


@op("Transpose")
def transpose(ctx, x):
    perm = ctx.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(perm)


@op("Concat")
def concat(ctx, *xs):
    axis = axis_of(ctx.attr("axis"), xs[0].dim())
    return torch.cat(xs, dim=axis)


@op("Split")
def split(ctx, x, sizes=None):
    axis = axis_of(ctx.attr("axis", 0), x.dim())
    parts = ctx.attr("split") if ctx.opset < 13 else ctx.ints(1, sizes)
    if not parts:
        n = ctx.attr("num_outputs", ctx.num_outputs)
        dim = x.shape[axis]
        chunk = -(-dim // n)  # an uneven split makes the last part smaller
        parts = [min(chunk, dim - i * chunk) for i in range(n)]
    return tuple(torch.split(x, list(parts), dim=axis))


def _slice_axis(x, axis, start, end, step):
    dim = x.shape[axis]
    if step > 0:
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if end <= start:
            return x.narrow(axis, 0, 0)
        if step == 1:
            return x.narrow(axis, start, end - start)
        index = [slice(None)] * x.dim()
        index[axis] = slice(start, end, step)
        return x[tuple(index)]
    # negative steps: clamp to [-1, dim - 1] and gather the indices (torch slices step forward only)
    start = min(max(start + dim if start < 0 else start, -1), dim - 1)
    end = min(max(end + dim if end < 0 else end, -1), dim - 1)
    idx = torch.arange(start, end, step, device=x.device)
    return x.index_select(axis, idx)


@op("Slice")
def slice_(ctx, x, starts=None, ends=None, axes=None, steps=None):
    if ctx.opset < 10:
        starts, ends, axes_v, steps_v = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends = ctx.ints(1, starts), ctx.ints(2, ends)
        axes_v, steps_v = ctx.ints(3, axes), ctx.ints(4, steps)
    axes_v = axes_v or list(range(len(starts)))
    steps_v = steps_v or [1] * len(starts)
    for a, s, e, st in zip(axes_v, starts, ends, steps_v, strict=False):
        x = _slice_axis(x, axis_of(a, x.dim()), s, e, st)
    return x


@op("Tile")
def tile(ctx, x, repeats):
    return x.repeat(ctx.ints(1, repeats))


@op("Expand")
def expand(ctx, x, target):
    dims = ctx.ints(1, target)
    out = torch.broadcast_shapes(tuple(x.shape), tuple(dims))
    return x.expand(out)


def _pad_indices(n, b, e, mode, device):
    idx = torch.arange(-b, n + e, device=device)
    if mode == "edge":
        return idx.clamp(0, n - 1)
    if mode == "wrap":
        return idx % n
    # reflect: mirror without repeating the edge element
    period = 2 * (n - 1) if n > 1 else 1
    idx = idx.abs() % period
    return torch.where(idx >= n, period - idx, idx)


@op("Pad")
def pad(ctx, x, pads=None, value=None, axes=None):
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pad_list = ctx.attr("pads") or ctx.attr("paddings")
        fill = ctx.attr("value", 0.0)
        axes_v = list(range(x.dim()))
    else:
        pad_list = ctx.ints(1, pads)
        fill = 0 if value is None or value.numel() == 0 else ctx.scalar(2, value)
        axes_v = ctx.ints(3, axes) or list(range(x.dim()))
    axes_v = [axis_of(a, x.dim()) for a in axes_v]
    k = len(axes_v)
    begin = [0] * x.dim()
    end = [0] * x.dim()
    for i, a in enumerate(axes_v):
        begin[a], end[a] = pad_list[i], pad_list[i + k]
    if mode == "constant":
        return F.pad(x, _reverse_pairs(begin, end), value=fill)
    for a in range(x.dim()):
        if begin[a] or end[a]:
            x = x.index_select(a, _pad_indices(x.shape[a], begin[a], end[a], mode, x.device))
    return x


def _reverse_pairs(begin, end):
    out = []
    for b, e in zip(reversed(begin), reversed(end), strict=False):
        out += [b, e]
    return out


@op("ConstantOfShape")
def constant_of_shape(ctx, target):
    value = ctx.attr("value")
    dims = ctx.ints(0, target)
    if value is None:
        return torch.zeros(dims, dtype=torch.float32, device=target.device)
    return value.reshape(-1)[:1].reshape(()).to(target.device).expand(dims).clone()


@op("Range")
def range_(ctx, start, limit, delta):
    s, l_, d = ctx.scalar(0, start), ctx.scalar(1, limit), ctx.scalar(2, delta)
    count = max(math.ceil((l_ - s) / d), 0)
    # start + i * delta, as ONNX defines it (arange's float accumulation can differ)
    return (
        torch.arange(
            count,
            device=start.device,
            dtype=torch.float64 if start.dtype.is_floating_point else torch.int64,
        )
        * d
        + s
    ).to(start.dtype)


@op("DepthToSpace")
def depth_to_space(ctx, x):
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def space_to_depth(ctx, x):
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = (
        y.permute(0, 3, 5, 1, 2, 4)
        if ctx.attr("mode", "DCR") == "DCR"
        else y.permute(0, 1, 3, 5, 2, 4)
    )
    return y.reshape(n, c * b * b, h // b, w // b)


@op("Trilu")
def trilu(ctx, x, k=None):
    k = 0 if k is None else int(ctx.scalar(1, k))
    return torch.triu(x, k) if ctx.attr("upper", 1) else torch.tril(x, k)


@op("EyeLike")
def eye_like(ctx, x):
    dtype = torch_dtype(ctx.attr("dtype"), ctx) if ctx.attr("dtype") is not None else x.dtype
    n, m = x.shape
    k = ctx.attr("k", 0)
    rows = torch.arange(n, device=x.device).reshape(-1, 1)
    cols = torch.arange(m, device=x.device).reshape(1, -1)
    return (cols - rows == k).to(dtype)


@op("CumSum")
def cumsum(ctx, x, axis):
    a = axis_of(int(ctx.scalar(1, axis)), x.dim())
    reverse = ctx.attr("reverse", 0)
    if reverse:
        x = x.flip(a)
    y = torch.cumsum(x, dim=a).to(x.dtype)
    if ctx.attr("exclusive", 0):
        y = y - x
    return y.flip(a) if reverse else y
