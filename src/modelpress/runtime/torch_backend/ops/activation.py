"""Activations and the softmax family.

Softmax, LogSoftmax and Hardmax before opset 13 flatten the input to 2-D at ``axis`` (default 1)
and normalise over the second dimension; from opset 13 they work along one axis (default -1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from modelpress.runtime.torch_backend.ops.elementwise import unary
from modelpress.runtime.torch_backend.registry import axis_of, op

_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875

# activations that are one torch function of x
for _name, _fn in {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh}.items():
    op(_name)(unary(_fn))


@op("LeakyRelu")
def leaky_relu(ctx, x):
    return F.leaky_relu(x, ctx.attr("alpha", 0.01))


@op("PRelu")
def prelu(ctx, x, slope):
    return torch.where(x < 0, x * slope, x)


@op("HardSigmoid")
def hard_sigmoid(ctx, x):
    return torch.clamp(ctx.attr("alpha", 0.2) * x + ctx.attr("beta", 0.5), 0, 1)


@op("HardSwish")
def hard_swish(ctx, x):
    return x * torch.clamp(x / 6 + 0.5, 0, 1)


@op("Elu")
def elu(ctx, x):
    return F.elu(x, ctx.attr("alpha", 1.0))


@op("Selu")
def selu(ctx, x):
    alpha = ctx.attr("alpha", _SELU_ALPHA)
    gamma = ctx.attr("gamma", _SELU_GAMMA)
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@op("Celu")
def celu(ctx, x):
    return F.celu(x, ctx.attr("alpha", 1.0))


@op("Softplus")
def softplus(ctx, x):
    # log(1 + exp(x)), stable for large x
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


@op("Softsign")
def softsign(ctx, x):
    return x / (1 + torch.abs(x))


@op("Gelu")
def gelu(ctx, x):
    return F.gelu(x, approximate=ctx.attr("approximate", "none"))


@op("Mish")
def mish(ctx, x):
    return x * torch.tanh(softplus(ctx, x))


@op("Swish")
def swish(ctx, x):
    return x * torch.sigmoid(ctx.attr("alpha", 1.0) * x)


@op("ThresholdedRelu")
def thresholded_relu(ctx, x):
    return torch.where(x > ctx.attr("alpha", 1.0), x, torch.zeros_like(x))


@op("Shrink")
def shrink(ctx, x):
    lambd = ctx.attr("lambd", 0.5)
    bias = ctx.attr("bias", 0.0)
    out = torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))
    return out.to(x.dtype)


def _along_axis(ctx, x, fn):
    if ctx.opset >= 13:
        return fn(x, axis_of(ctx.attr("axis", -1), x.dim()))
    axis = axis_of(ctx.attr("axis", 1), x.dim())
    rows = math.prod(x.shape[:axis])
    return fn(x.reshape(rows, -1), 1).reshape(x.shape)


@op("Softmax")
def softmax(ctx, x):
    return _along_axis(ctx, x, lambda t, d: torch.softmax(t, d))


@op("LogSoftmax")
def log_softmax(ctx, x):
    return _along_axis(ctx, x, lambda t, d: torch.log_softmax(t, d))


def _hardmax(t, d):
    # argmax returns the first maximum, which is the element ONNX marks
    return F.one_hot(torch.argmax(t, d), t.shape[d]).movedim(-1, d).to(t.dtype)


@op("Hardmax")
def hardmax(ctx, x):
    return _along_axis(ctx, x, _hardmax)
