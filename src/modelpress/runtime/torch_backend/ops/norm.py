"""Normalizations. BatchNormalization uses its running statistics (inference semantics) unless the
node itself sets ``training_mode=1``; ``stash_type`` computes statistics in float32 for half inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from modelpress.runtime.torch_backend.registry import axis_of, op


@op("BatchNormalization")
def batch_norm(ctx, x, scale, bias, mean, var):
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.attr("training_mode", 0):
        dims = [0] + list(range(2, x.dim()))
        shape = (1, -1) + (1,) * (x.dim() - 2)
        bmean = x.mean(dim=dims)
        bvar = x.var(dim=dims, unbiased=False)
        y = (x - bmean.reshape(shape)) / torch.sqrt(bvar.reshape(shape) + eps) * scale.reshape(
            shape
        ) + bias.reshape(shape)
        momentum = ctx.attr("momentum", 0.9)
        return y, mean * momentum + bmean * (1 - momentum), var * momentum + bvar * (1 - momentum)
    y = F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
    return (y,) + (mean, var)[: ctx.num_outputs - 1] if ctx.num_outputs > 1 else y


def _stash(ctx, x):
    stash = ctx.attr("stash_type", 1)
    return x.to(torch.float32) if stash == 1 and x.dtype in (torch.float16, torch.bfloat16) else x


@op("LayerNormalization")
def layer_norm(ctx, x, scale, bias=None):
    axis = axis_of(ctx.attr("axis", -1), x.dim())
    eps = ctx.attr("epsilon", 1e-5)
    norm_shape = tuple(x.shape[axis:])
    if (
        ctx.num_outputs == 1
        and tuple(scale.shape) == norm_shape
        and (bias is None or tuple(bias.shape) == norm_shape)
        and x.dtype == torch.float32
    ):
        return F.layer_norm(x, norm_shape, scale, bias, eps)
    xs = _stash(ctx, x)
    dims = tuple(range(axis, x.dim()))
    mean = xs.mean(dim=dims, keepdim=True)
    var = ((xs - mean) ** 2).mean(dim=dims, keepdim=True)
    inv_std = torch.rsqrt(var + eps)
    y = ((xs - mean) * inv_std).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, mean, inv_std)[: ctx.num_outputs] if ctx.num_outputs > 1 else y


@op("RMSNormalization", since=23)
def rms_norm(ctx, x, scale):
    axis = axis_of(ctx.attr("axis", -1), x.dim())
    eps = ctx.attr("epsilon", 1e-5)
    xs = _stash(ctx, x)
    dims = tuple(range(axis, x.dim()))
    y = xs * torch.rsqrt((xs * xs).mean(dim=dims, keepdim=True) + eps)
    return y.to(x.dtype) * scale


@op("InstanceNormalization")
def instance_norm(ctx, x, scale, bias):
    return F.instance_norm(x, weight=scale, bias=bias, eps=ctx.attr("epsilon", 1e-5))


@op("GroupNormalization", since=18)
def group_norm(ctx, x, scale, bias):
    groups = ctx.attr("num_groups")
    eps = ctx.attr("epsilon", 1e-5)
    c = x.shape[1]
    if ctx.opset < 21 and scale.numel() == groups and groups != c:
        # opset 18 scales per group; later opsets per channel
        scale = scale.repeat_interleave(c // groups)
        bias = bias.repeat_interleave(c // groups)
    xs = _stash(ctx, x)
    n = x.shape[0]
    g = xs.reshape(n, groups, -1)
    mean = g.mean(dim=-1, keepdim=True)
    var = ((g - mean) ** 2).mean(dim=-1, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(x.shape).to(x.dtype)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return y * scale.reshape(shape) + bias.reshape(shape)


@op("LpNormalization")
def lp_norm(ctx, x):
    axis = axis_of(ctx.attr("axis", -1), x.dim())
    p = ctx.attr("p", 2)
    norm = (
        torch.abs(x).sum(dim=axis, keepdim=True)
        if p == 1
        else torch.sqrt((x * x).sum(dim=axis, keepdim=True))
    )
    # a zero vector stays zero (the reference divides 0 by 0 and keeps 0)
    return torch.where(norm == 0, torch.zeros_like(x), x / norm)


@op("LRN")
def lrn(ctx, x):
    size = ctx.attr("size")
    alpha = ctx.attr("alpha", 1e-4)
    beta = ctx.attr("beta", 0.75)
    bias = ctx.attr("bias", 1.0)
    n, c = x.shape[:2]
    sq = (x * x).reshape(n, 1, c, -1)
    # the window over channels is [c - floor((size-1)/2), c + ceil((size-1)/2)]
    sq = F.pad(sq, (0, 0, (size - 1) // 2, math.ceil((size - 1) / 2)))
    window = F.avg_pool2d(sq, (size, 1), stride=1) * size
    return x / (bias + alpha / size * window.reshape(x.shape)) ** beta


@op("MeanVarianceNormalization")
def mean_variance_norm(ctx, x):
    axes = tuple(ctx.attr("axes", [0, 2, 3]))
    mean = x.mean(dim=axes, keepdim=True)
    var = (x * x).mean(dim=axes, keepdim=True) - mean * mean
    return (x - mean) / (torch.sqrt(var) + 1e-9)
