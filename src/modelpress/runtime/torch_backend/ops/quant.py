"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer/QLinear
products (MatMulInteger lives in linalg.py).

``y = saturate(round(x / scale) + zero_point)`` (round half to even) and ``x = (y - zero_point) *
scale``; scale and zero point are per tensor, per axis (1-D along ``axis``) or per block
(``block_size`` along ``axis``). Rounding has no gradient: fake-quantization training wraps these
kernels with a straight-through estimator rather than changing their ONNX semantics here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelpress.runtime.torch_backend.ops.elementwise import to_float8
from modelpress.runtime.torch_backend.registry import axis_of, op, torch_dtype


def _expand(param, x, axis, block):
    """``param`` shaped to broadcast against ``x``."""
    if param.dim() == 0 or (param.dim() == 1 and param.numel() == 1):
        return param.reshape(())
    axis = axis_of(axis, x.dim())
    if block:
        return param.repeat_interleave(block, dim=axis).narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return param.reshape(shape)


def _saturate(y, dtype):
    if dtype.is_floating_point:
        return y.to(dtype)
    info = torch.iinfo(dtype)
    return torch.clamp(y, info.min, info.max).to(dtype)


@op("QuantizeLinear")
def quantize_linear(ctx, x, scale, zero_point=None):
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    if zero_point is not None:
        dtype = zero_point.dtype
    elif ctx.attr("output_dtype"):
        dtype = torch_dtype(ctx.attr("output_dtype"), ctx)
    else:
        dtype = torch.uint8
    s = _expand(scale, x, axis, block)
    if dtype.is_floating_point:  # float8: no rounding, the cast rounds
        y = x.to(torch.float32) / s.to(torch.float32)
        if zero_point is not None:
            y = y + _expand(zero_point, x, axis, block).to(torch.float32)
        return to_float8(y, dtype, bool(ctx.attr("saturate", 1)))
    y = torch.round(x.to(torch.float32) / s.to(torch.float32))
    if zero_point is not None:
        y = y + _expand(zero_point, x, axis, block).to(torch.float32)
    return _saturate(y, dtype)


@op("DequantizeLinear")
def dequantize_linear(ctx, x, scale, zero_point=None):
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    s = _expand(scale, x, axis, block)
    if x.dtype.is_floating_point:
        v = x.to(torch.float32)
        if zero_point is not None:
            v = v - _expand(zero_point, x, axis, block).to(torch.float32)
    else:
        v = x.to(torch.int64)
        if zero_point is not None:
            v = v - _expand(zero_point, x, axis, block).to(torch.int64)
        v = v.to(torch.float32)
    out_dtype = (
        torch_dtype(ctx.attr("output_dtype"), ctx) if ctx.attr("output_dtype") else scale.dtype
    )
    return (v * s.to(torch.float32)).to(out_dtype)


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx, x):
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    lo = torch.minimum(x.min(), zero)
    hi = torch.maximum(x.max(), zero)
    scale = (hi - lo) / 255
    zp = torch.clamp(torch.round(-lo / scale), 0, 255)
    y = torch.clamp(torch.round(x / scale) + zp, 0, 255)
    return y.to(torch.uint8), scale.to(x.dtype), zp.to(torch.uint8)


def _dequant(q, scale, zp, axis_shape=None):
    v = q.to(torch.float64)
    if zp is not None:
        v = v - (
            zp.to(torch.float64) if axis_shape is None else zp.to(torch.float64).reshape(axis_shape)
        )
    return v, scale.to(torch.float64) if axis_shape is None or scale.numel() == 1 else scale.to(
        torch.float64
    ).reshape(axis_shape)


@op("QLinearMatMul")
def qlinear_matmul(ctx, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    av, as_ = _dequant(a, a_scale, a_zp)
    bv, bs = _dequant(b, b_scale, b_zp)
    # integer product first (exact in float64), then one requantization, as ONNX describes
    acc = torch.matmul(av, bv) * (as_ * bs)
    y = torch.round(acc / y_scale.to(torch.float64)) + y_zp.to(torch.float64)
    return _saturate(y, y_zp.dtype)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _conv_int(ctx, x, w, x_zp, w_zp):
    from modelpress.runtime.torch_backend.ops.conv import _geometry, _torch_pad

    n, _, strides, dilations, begin, end = _geometry(ctx, x, w.shape[2:])
    xv = x.to(torch.float64) - (0 if x_zp is None else x_zp.to(torch.float64).reshape(()))
    wv = w.to(torch.float64)
    if w_zp is not None:
        wv = wv - (
            w_zp.to(torch.float64).reshape(-1, *([1] * (w.dim() - 1)))
            if w_zp.numel() > 1
            else w_zp.to(torch.float64).reshape(())
        )
    xv = F.pad(xv, _torch_pad(begin, end))
    return _CONV[n](xv, wv, None, strides, 0, dilations, ctx.attr("group", 1))


@op("ConvInteger")
def conv_integer(ctx, x, w, x_zp=None, w_zp=None):
    return _conv_int(ctx, x, w, x_zp, w_zp).to(torch.int32)


@op("QLinearConv")
def qlinear_conv(ctx, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None):
    acc = _conv_int(ctx, x, w, x_zp, w_zp)
    if b is not None:
        acc = acc + b.to(torch.float64).reshape(1, -1, *([1] * (x.dim() - 2)))
    ws = w_scale.to(torch.float64)
    ws = ws.reshape(1, -1, *([1] * (x.dim() - 2))) if ws.numel() > 1 else ws.reshape(())
    acc = acc * (x_scale.to(torch.float64).reshape(()) * ws)
    y = torch.round(acc / y_scale.to(torch.float64)) + y_zp.to(torch.float64)
    return _saturate(y, y_zp.dtype)
