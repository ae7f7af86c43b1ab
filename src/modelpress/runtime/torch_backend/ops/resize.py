"""Resize (and the older Upsample) in every mode ONNX defines, as separable 1-D interpolations.

For each resized axis the output coordinates are mapped back to the input by the
``coordinate_transformation_mode``; then ``nearest`` picks one index (``nearest_mode`` rounding),
``linear`` blends the two neighbours and ``cubic`` four (Keys kernel with ``cubic_coeff_a``,
``exclude_outside`` renormalising the taps that fall outside). Indices past the edges repeat the
edge value, as the ONNX reference does. Separable passes equal the N-D interpolation exactly.
Before opset 11 (and in Upsample) coordinates are ``asymmetric`` and nearest rounds down.
"""

from __future__ import annotations

import math

import torch

from modelpress.runtime.torch_backend.registry import axis_of, op


def _coords(mode, out_size, in_size, scale, roi_start, roi_end):
    # With scales given, the reference maps coordinates with in_size * scale, not the floored size.
    x = torch.arange(out_size, dtype=torch.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        offset = in_size / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_size > 1 else torch.zeros_like(x)
    if mode == "align_corners":
        return x * (in_size - 1) / (in_size * scale - 1) if out_size > 1 else torch.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        if out_size > 1:
            return roi_start * (in_size - 1) + x * (roi_end - roi_start) * (in_size - 1) / (
                in_size * scale - 1
            )
        return torch.full_like(x, 0.5 * (roi_start + roi_end) * (in_size - 1))
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(coords, rounding):
    if rounding == "round_prefer_floor":
        idx = torch.ceil(coords - 0.5)
    elif rounding == "round_prefer_ceil":
        idx = torch.floor(coords + 0.5)
    elif rounding == "floor":
        idx = torch.floor(coords)
    else:
        idx = torch.ceil(coords)
    # integer coordinates are exact; guard against x.5 rounding noise from the float mapping
    return idx.to(torch.int64)


def _cubic_weights(t, a):
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _resize_axis(x, axis, coords, *, mode, rounding, cubic_a, exclude_outside):
    n = x.shape[axis]
    shape = [1] * x.dim()
    shape[axis] = -1

    def take(idx):
        return x.index_select(axis, idx.clamp(0, n - 1).to(x.device))

    if mode == "nearest":
        return take(_nearest(coords, rounding))
    if mode == "linear":
        c = coords.clamp(0, n - 1)
        i0 = torch.floor(c)
        w1 = (c - i0).to(x.dtype).to(x.device).reshape(shape)
        i0 = i0.to(torch.int64)
        return take(i0) * (1 - w1) + take(i0 + 1) * w1
    base = torch.floor(coords)
    t = coords - base
    base = base.to(torch.int64)
    weights = _cubic_weights(t, cubic_a)
    idxs = [base + k for k in (-1, 0, 1, 2)]
    if exclude_outside:
        weights = [
            torch.where((i >= 0) & (i < n), w, torch.zeros_like(w))
            for i, w in zip(idxs, weights, strict=False)
        ]
        total = sum(weights)
        weights = [w / total for w in weights]
    out = 0
    for i, w in zip(idxs, weights, strict=False):
        out = out + take(i) * w.to(x.dtype).to(x.device).reshape(shape)
    return out


@op("Resize")
def resize(ctx, x, roi=None, scales=None, sizes=None):
    if ctx.attr("antialias", 0):
        raise ctx.unsupported("Resize with antialias=1")
    rank = x.dim()
    axes = [axis_of(a, rank) for a in (ctx.attr("axes") or range(rank))]
    mode = ctx.attr("mode", "nearest")
    if ctx.opset < 11:
        scales, sizes, roi = roi, None, None  # opset 10: (X, scales)
        coord_mode, rounding = "asymmetric", "floor"
    else:
        coord_mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
        rounding = ctx.attr("nearest_mode", "round_prefer_floor")
    in_sizes = [x.shape[a] for a in axes]
    if sizes is not None and sizes.numel() > 0:
        out_sizes = ctx.ints(3, sizes)
        scale_v = [o / i for o, i in zip(out_sizes, in_sizes, strict=False)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(scale_v) if policy == "not_larger" else max(scale_v)
            scale_v = [s] * len(axes)
            out_sizes = [int(math.floor(i * s + 0.5)) for i in in_sizes]
    else:
        scale_v = ctx.floats(2 if ctx.opset >= 11 else 1, scales)
        if len(scale_v) == rank and len(axes) != rank:
            scale_v = [scale_v[a] for a in axes]
        out_sizes = [int(math.floor(i * s)) for i, s in zip(in_sizes, scale_v, strict=False)]
    roi_v = ctx.floats(1, roi) if roi is not None and roi.numel() > 0 else None
    outside = None
    for k, a in enumerate(axes):
        if out_sizes[k] == in_sizes[k] and scale_v[k] == 1.0 and coord_mode != "tf_crop_and_resize":
            continue
        if roi_v is not None:
            m = len(roi_v) // 2
            j = a if m == rank else k
            start, end = roi_v[j], roi_v[j + m]
        else:
            start, end = 0.0, 1.0
        coords = _coords(coord_mode, out_sizes[k], in_sizes[k], scale_v[k], start, end)
        if coord_mode == "tf_crop_and_resize":
            bad = (coords < 0) | (coords > in_sizes[k] - 1)
            shape = [1] * rank
            shape[a] = -1
            bad = bad.reshape(shape).to(x.device)
            outside = bad if outside is None else outside | bad
        x = _resize_axis(
            x,
            a,
            coords,
            mode=mode,
            rounding=rounding,
            cubic_a=ctx.attr("cubic_coeff_a", -0.75),
            exclude_outside=ctx.attr("exclude_outside", 0),
        )
    if outside is not None:
        fill = torch.tensor(ctx.attr("extrapolation_value", 0.0), dtype=x.dtype, device=x.device)
        x = torch.where(outside, fill, x)
    return x


@op("Upsample")
def upsample(ctx, x, scales=None):
    scale_v = ctx.attr("scales") if scales is None else ctx.floats(1, scales)
    mode = ctx.attr("mode", "nearest")
    mode = "linear" if mode in ("linear", "bilinear") else "nearest"
    for a, s in enumerate(scale_v):
        if s == 1.0:
            continue
        out = int(math.floor(x.shape[a] * s))
        coords = _coords("asymmetric", out, x.shape[a], s, 0.0, 1.0)
        x = _resize_axis(
            x, a, coords, mode=mode, rounding="floor", cubic_a=-0.75, exclude_outside=0
        )
    return x
