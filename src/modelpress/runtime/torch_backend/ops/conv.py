"""Convolutions and pooling in 1-D, 2-D and 3-D.

ONNX pads are ``[x1_begin, x2_begin, ..., x1_end, x2_end]`` and may be asymmetric; torch pads
symmetrically, so asymmetric (or too large) pads are applied with ``F.pad`` first. ``auto_pad``
SAME_UPPER/SAME_LOWER put the odd extra pad at the end/beginning. Average pooling that torch cannot
express directly (dilations, asymmetric pads) is a window sum divided by a window count, both
computed with a depthwise convolution of ones, so that ``count_include_pad`` is exact.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from modelpress.runtime.torch_backend.registry import op

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pads(ctx, spatial, kernel, strides, dilations, ceil_mode=False):
    """(begin, end) pads per spatial axis, resolving auto_pad."""
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=False):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - small if auto == "SAME_UPPER" else small)
        return begin, end
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = ctx.attr("pads") or [0] * (2 * n)
    return list(pads[:n]), list(pads[n:])


def _torch_pad(begin, end):
    # F.pad takes pairs starting from the last dimension
    out = []
    for b, e in zip(reversed(begin), reversed(end), strict=False):
        out += [b, e]
    return out


def _geometry(ctx, x, kernel=None):
    n = x.dim() - 2
    kernel = list(kernel if kernel is not None else ctx.attr("kernel_shape"))
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    begin, end = _pads(ctx, list(x.shape[2:]), kernel, strides, dilations)
    return n, kernel, strides, dilations, begin, end


@op("Conv")
def conv(ctx, x, w, b=None):
    n, kernel, strides, dilations, begin, end = _geometry(ctx, x, w.shape[2:])
    group = ctx.attr("group", 1)
    if begin == end:
        return _CONV[n](x, w, b, strides, begin, dilations, group)
    x = F.pad(x, _torch_pad(begin, end))
    return _CONV[n](x, w, b, strides, 0, dilations, group)


@op("ConvTranspose")
def conv_transpose(ctx, x, w, b=None):
    n = x.dim() - 2
    kernel = list(w.shape[2:])
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    out_pad = list(ctx.attr("output_padding") or [0] * n)
    group = ctx.attr("group", 1)
    spatial = list(x.shape[2:])
    full = [
        s * (i - 1) + op_ + (k - 1) * d + 1
        for i, s, op_, k, d in zip(spatial, strides, out_pad, kernel, dilations, strict=False)
    ]
    output_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if output_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is None:
            output_shape = [i * s for i, s in zip(spatial, strides, strict=False)]
        output_shape = list(output_shape)[-n:]
        begin, end = [], []
        for f, o in zip(full, output_shape, strict=False):
            total = f - o
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = ctx.attr("pads") or [0] * (2 * n)
        begin, end = list(pads[:n]), list(pads[n:])
    y = _CONV_T[n](x, w, None, strides, 0, 0, group, dilations)
    # output_padding adds rows at the end that no input reaches; negative pads crop.
    y = F.pad(
        y, _torch_pad([-p for p in begin], [op_ - p for op_, p in zip(out_pad, end, strict=False)])
    )
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _ceil_extra(size, k, s, d, b, e):
    """Extra end padding that ceil_mode needs for its last window (which must start inside)."""
    eff = (k - 1) * d + 1
    padded = size + b + e
    out = -(-(padded - eff) // s) + 1
    if (out - 1) * s >= size + b:  # a window may not start in the end padding
        out -= 1
    return max(0, (out - 1) * s + eff - padded)


@op("MaxPool")
def max_pool(ctx, x):
    n, kernel, strides, dilations, begin, end = _geometry(ctx, x)
    ceil = bool(ctx.attr("ceil_mode", 0))
    want_idx = ctx.num_outputs > 1 and ctx.outputs_used[1]
    fast = begin == end and all(p <= k // 2 for p, k in zip(begin, kernel, strict=False))
    if x.dtype in (torch.int8, torch.uint8) and not want_idx:
        # torch has no integer max pooling; go through float (exact for 8-bit values)
        return max_pool(ctx, x.to(torch.float32)).to(x.dtype)
    if fast:
        xp, pb = x, [0] * n
        y = _MAX_POOL[n](x, kernel, strides, begin, dilations, ceil, return_indices=want_idx)
    else:
        xp = F.pad(x, _torch_pad(begin, end), value=float("-inf"))
        pb = begin
        y = _MAX_POOL[n](xp, kernel, strides, 0, dilations, ceil, return_indices=want_idx)
    if not want_idx:
        return y
    y, idx = y
    # torch indexes within each (N, C) plane of the tensor it pooled; ONNX indexes the whole input
    # tensor, row-major or, with storage_order=1, column-major over the spatial axes.
    padded = list(xp.shape[2:])
    spatial = list(x.shape[2:])
    coords = []
    rem = idx
    for size in reversed(padded):
        coords.append(rem % size)
        rem = rem // size
    coords = [c - p for c, p in zip(reversed(coords), pb, strict=False)]
    flat = torch.zeros_like(idx)
    if ctx.attr("storage_order", 0):
        stride = 1
        for c, size in zip(coords, spatial, strict=False):
            flat = flat + c * stride
            stride *= size
    else:
        for c, size in zip(coords, spatial, strict=False):
            flat = flat * size + c
    plane = math.prod(spatial)
    nc = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(
        x.shape[0], x.shape[1], *([1] * n)
    )
    return y, flat + nc * plane


def _window_sum(x, kernel, strides, dilations):
    c = x.shape[1]
    ones = torch.ones((c, 1, *kernel), dtype=x.dtype, device=x.device)
    return _CONV[x.dim() - 2](x, ones, None, strides, 0, dilations, c)


@op("AveragePool")
def average_pool(ctx, x):
    n, kernel, strides, dilations, begin, end = _geometry(ctx, x)
    ceil = bool(ctx.attr("ceil_mode", 0))
    include = bool(ctx.attr("count_include_pad", 0))
    if (
        begin == end
        and all(p <= k // 2 for p, k in zip(begin, kernel, strict=False))
        and all(d == 1 for d in dilations)
    ):
        return _AVG_POOL[n](x, kernel, strides, begin, ceil, include)
    extra = [0] * n
    if ceil:
        extra = [
            _ceil_extra(sz, k, s, d, b, e)
            for sz, k, s, d, b, e in zip(
                x.shape[2:], kernel, strides, dilations, begin, end, strict=False
            )
        ]
    ends = [e + x_ for e, x_ in zip(end, extra, strict=False)]
    xp = F.pad(x, _torch_pad(begin, ends))
    mask = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if include:  # explicit pads count, the ceil_mode overflow does not
        mask = F.pad(mask, _torch_pad(begin, end), value=1.0)
        mask = F.pad(mask, _torch_pad([0] * n, extra))
    else:
        mask = F.pad(mask, _torch_pad(begin, ends))
    total = _window_sum(xp, kernel, strides, dilations)
    count = _window_sum(mask, kernel, strides, dilations)
    return total / count


@op("LpPool")
def lp_pool(ctx, x):
    n, kernel, strides, dilations, begin, end = _geometry(ctx, x)
    p = ctx.attr("p", 2)
    xp = F.pad(torch.abs(x) ** p, _torch_pad(begin, end))
    if ctx.attr("ceil_mode", 0):
        extra = [
            _ceil_extra(sz, k, s, d, b, e)
            for sz, k, s, d, b, e in zip(
                x.shape[2:], kernel, strides, dilations, begin, end, strict=False
            )
        ]
        xp = F.pad(xp, _torch_pad([0] * n, extra))
    return _window_sum(xp, kernel, strides, dilations) ** (1.0 / p)


@op("GlobalAveragePool")
def global_average_pool(ctx, x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@op("GlobalMaxPool")
def global_max_pool(ctx, x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op("GlobalLpPool")
def global_lp_pool(ctx, x):
    p = ctx.attr("p", 2)
    return (torch.abs(x) ** p).sum(dim=tuple(range(2, x.dim())), keepdim=True) ** (1.0 / p)
