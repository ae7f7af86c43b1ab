"""Indexing: Gather*, Scatter*, OneHot, TopK, NonZero, Compress, ReverseSequence.

ONNX indices may be negative (counted from the end of the axis); torch's gather/scatter need them
normalized first.
"""

from __future__ import annotations

import math

import torch

from modelpress.runtime.torch_backend.registry import axis_of, op


def _normalize(idx, dim):
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + dim, idx)


@op("Gather")
def gather(ctx, x, indices):
    axis = axis_of(ctx.attr("axis", 0), x.dim())
    if ctx.consts[1] is not None and indices.dim() == 0:
        # a constant scalar index (shape arithmetic): one select, normalized in Python
        i = int(ctx.consts[1][0])
        return x.select(axis, i + x.shape[axis] if i < 0 else i)
    idx = _normalize(indices, x.shape[axis])
    out = x.index_select(axis, idx.reshape(-1))
    return out.reshape(tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1 :]))


@op("GatherElements")
def gather_elements(ctx, x, indices):
    axis = axis_of(ctx.attr("axis", 0), x.dim())
    return torch.gather(x, axis, _normalize(indices, x.shape[axis]))


def _nd_index(x, indices, batch_dims):
    """Flattened batch, and the index tuple that selects x's first k non-batch axes."""
    k = indices.shape[-1]
    batch = math.prod(x.shape[:batch_dims])
    xb = x.reshape((batch,) + tuple(x.shape[batch_dims:]))
    ib = indices.reshape((batch,) + tuple(indices.shape[batch_dims:])).to(torch.int64)
    bidx = torch.arange(batch, device=x.device).reshape((batch,) + (1,) * (ib.dim() - 2))
    parts = [bidx.expand(ib.shape[:-1])]
    for j in range(k):
        parts.append(_normalize(ib[..., j], xb.shape[1 + j]))
    return xb, tuple(parts), k


@op("GatherND")
def gather_nd(ctx, x, indices):
    b = ctx.attr("batch_dims", 0)
    xb, index, k = _nd_index(x, indices, b)
    out = xb[index]
    return out.reshape(tuple(indices.shape[:-1]) + tuple(x.shape[b + k :]))


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op("ScatterElements", "Scatter")
def scatter_elements(ctx, x, indices, updates):
    axis = axis_of(ctx.attr("axis", 0), x.dim())
    idx = _normalize(indices, x.shape[axis])
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        return torch.scatter(x, axis, idx, updates)
    return torch.scatter_reduce(x, axis, idx, updates, _REDUCE[reduction], include_self=True)


@op("ScatterND")
def scatter_nd(ctx, x, indices, updates):
    k = indices.shape[-1]
    lead = tuple(x.shape[:k])
    rest = tuple(x.shape[k:])
    idx = indices.reshape(-1, k).to(torch.int64)
    linear = torch.zeros(idx.shape[0], dtype=torch.int64, device=x.device)
    for j in range(k):
        linear = linear * lead[j] + _normalize(idx[:, j], lead[j])
    flat = x.reshape((math.prod(lead),) + rest)
    upd = updates.reshape((-1,) + rest)
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        out = flat.index_copy(0, linear, upd)
    elif reduction == "add":
        out = flat.index_add(0, linear, upd)
    else:
        index = linear.reshape((-1,) + (1,) * len(rest)).expand(upd.shape)
        out = flat.scatter_reduce(0, index, upd, _REDUCE[reduction], include_self=True)
    return out.reshape(x.shape)


@op("OneHot")
def one_hot(ctx, indices, depth, values):
    d = int(ctx.scalar(1, depth))
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx)
    rank = indices.dim() + 1
    axis = axis_of(ctx.attr("axis", -1), rank)
    shape = [1] * rank
    shape[axis] = d
    classes = torch.arange(d, device=indices.device).reshape(shape)
    hit = idx.unsqueeze(axis) == classes
    return torch.where(hit, values[1], values[0])


@op("TopK")
def topk(ctx, x, k=None):
    kk = ctx.attr("k") if ctx.opset < 10 else int(ctx.scalar(1, k))
    axis = axis_of(ctx.attr("axis", -1), x.dim())
    largest = bool(ctx.attr("largest", 1))
    # a stable sort keeps the lower index first among equal values, as ONNX requires. CUDA sorts
    # no uint16/32/64: they are sorted by an int64 key of the same order, then mapped back.
    key, back = x, None
    if x.dtype in (torch.uint16, torch.uint32):
        key, back = x.to(torch.int64), lambda k: k.to(x.dtype)
    elif x.dtype == torch.uint64:
        sign = -(2**63)  # flipping the top bit turns unsigned order into signed order
        key, back = x.view(torch.int64) ^ sign, lambda k: (k ^ sign).view(torch.uint64)
    values, idx = torch.sort(key, dim=axis, descending=largest, stable=True)
    values = values.narrow(axis, 0, kk)
    return (values if back is None else back(values)), idx.narrow(axis, 0, kk)


@op("NonZero")
def nonzero(ctx, x):
    if x.dim() == 0:
        return torch.zeros((0, int(bool(x))), dtype=torch.int64, device=x.device)
    return torch.nonzero(x).transpose(0, 1).contiguous()


@op("Compress")
def compress(ctx, x, condition):
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = axis_of(axis, x.dim())
    keep = torch.nonzero(condition.reshape(-1)[: x.shape[axis]]).reshape(-1)
    return x.index_select(axis, keep)


@op("ReverseSequence")
def reverse_sequence(ctx, x, lengths):
    batch_axis = ctx.attr("batch_axis", 1)
    time_axis = ctx.attr("time_axis", 0)
    steps = x.shape[time_axis]
    t = torch.arange(steps, device=x.device).reshape(-1, 1)
    lens = lengths.to(torch.int64).reshape(1, -1)
    src = torch.where(t < lens, lens - 1 - t, t)  # [time, batch]
    if time_axis > batch_axis:
        src = src.transpose(0, 1)
    shape = [1] * x.dim()
    shape[time_axis] = steps
    shape[batch_axis] = x.shape[batch_axis]
    src = src.reshape(shape).expand(x.shape)
    return torch.gather(x, time_axis, src)
