"""Reductions and ArgMax/ArgMin.

Axes are an attribute up to opset 12 (ReduceSum) or 17 (the others) and an optional input since.
No axes means every axis, unless ``noop_with_empty_axes`` makes the node the identity. Reducing an
empty set gives the operation's identity (0 for sums, 1 for products, -inf for max, ...).
"""

from __future__ import annotations

import torch

from modelpress.runtime.torch_backend.registry import axis_of, op

_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


_KERNELS = {
    "ReduceSum": (lambda x, d, k: torch.sum(x, dim=d, keepdim=k), 0.0),
    "ReduceMean": (lambda x, d, k: torch.mean(x, dim=d, keepdim=k), float("nan")),
    "ReduceMax": (lambda x, d, k: torch.amax(x, dim=d, keepdim=k), float("-inf")),
    "ReduceMin": (lambda x, d, k: torch.amin(x, dim=d, keepdim=k), float("inf")),
    "ReduceProd": (_prod, 1.0),
    "ReduceL1": (lambda x, d, k: torch.sum(torch.abs(x), dim=d, keepdim=k), 0.0),
    "ReduceL2": (lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)), 0.0),
    "ReduceSumSquare": (lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k), 0.0),
    "ReduceLogSum": (lambda x, d, k: torch.log(torch.sum(x, dim=d, keepdim=k)), float("-inf")),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k), float("-inf")),
}


def _reduce(name):
    fn, empty_value = _KERNELS[name]
    since = _AXES_AS_INPUT_SINCE.get(name, 18)

    def kernel(ctx, x, axes=None):
        keep = bool(ctx.attr("keepdims", 1))
        axes_v = ctx.attr("axes") if ctx.opset < since else ctx.ints(1, axes)
        if not axes_v:
            if ctx.attr("noop_with_empty_axes", 0):
                return x
            axes_v = list(range(x.dim()))
        dims = tuple(sorted({axis_of(a, x.dim()) for a in axes_v}))
        if x.dim() == 0:
            return fn(x.reshape(1), (0,), False)
        if any(x.shape[d] == 0 for d in dims):
            shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
            fill = bool(empty_value > 0) if x.dtype == torch.bool else empty_value
            out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
            return out if keep else out.reshape([s for i, s in enumerate(x.shape) if i not in dims])
        if x.dtype == torch.bool:
            return fn(x.to(torch.uint8), dims, keep).to(torch.bool)
        return fn(x, dims, keep).to(x.dtype)

    return kernel


for _name in _KERNELS:
    op(_name)(_reduce(_name))


def _arg(fn):
    def kernel(ctx, x):
        axis = axis_of(ctx.attr("axis", 0), x.dim())
        keep = bool(ctx.attr("keepdims", 1))
        if ctx.attr("select_last_index", 0):
            flipped = fn(x.flip(axis), dim=axis, keepdim=keep)
            return x.shape[axis] - 1 - flipped
        return fn(x, dim=axis, keepdim=keep)

    return kernel


op("ArgMax")(_arg(torch.argmax))
op("ArgMin")(_arg(torch.argmin))
