"""Shape arithmetic in Python: the ``Shape -> Gather -> Concat -> Reshape`` chains of exported graphs.

Exporters compute reshape targets at run time from ``Shape`` of a tensor. Done with torch kernels,
every such node is a tiny int64 tensor op, and the ``.tolist()`` that finally turns the target into
Python ints breaks a ``torch.compile`` graph. So the program evaluates these nodes on Python values
instead, when every input is known in Python (a tensor's shape, a constant, or an earlier such
value) and the values are scalars or 1-D: ``Small(shape, values, dtype)``. A tensor is materialized
only when a kernel consumes the value as a tensor; kernels that want ints (Reshape, Expand, Slice,
...) read the Python values through ``NodeContext.known``. Under TorchDynamo with static shapes the
whole chain is constant, so the graph does not break. Anything outside these cases returns None and
the node runs as a normal kernel.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from modelpress.runtime.torch_backend.registry import torch_dtype


class Small(NamedTuple):
    shape: tuple[int, ...]  # () or (n,)
    values: tuple
    dtype: torch.dtype

    def tensor(self, device) -> torch.Tensor:
        return torch.tensor(self.values, dtype=self.dtype, device=device).reshape(self.shape)


def _small(values, dtype, scalar=False) -> Small:
    values = tuple(values)
    return Small(() if scalar else (len(values),), values, dtype)


def _shape(ctx, x):
    dims = list(x.shape)[ctx.attr("start", 0) : ctx.attr("end")]
    return _small(dims, torch.int64)


def _gather(ctx, data, idx):
    if len(data.shape) != 1 or ctx.attr("axis", 0) not in (0, -1) or len(idx.shape) > 1:
        return None
    n = len(data.values)
    picked = [data.values[i + n if i < 0 else i] for i in idx.values]
    return _small(picked, data.dtype, scalar=idx.shape == ())


def _unsqueeze(ctx, data, axes=None):
    axes_v = ctx.attr("axes") if axes is None else list(axes.values)
    if data.shape != () or list(axes_v) not in ([0], [-1]):
        return None
    return _small(data.values, data.dtype)


def _squeeze(ctx, data, axes=None):
    if data.shape != (1,):
        return None
    return _small(data.values, data.dtype, scalar=True)


def _concat(ctx, *parts):
    if any(p.shape == () for p in parts):
        return None
    return _small([v for p in parts for v in p.values], parts[0].dtype)


def _cast(ctx, x):
    dtype = torch_dtype(ctx.attr("to"), ctx)
    # floats stay in torch: Python computes in double precision, the graph in its own type
    if dtype == torch.bool:
        conv = bool
    elif dtype in (torch.int64, torch.int32):
        conv = int
    else:
        return None
    return Small(x.shape, tuple(conv(v) for v in x.values), dtype)


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _elementwise(fn, result_dtype=None):
    def kernel(ctx, a, b):
        if (
            a.dtype != b.dtype
            or a.dtype.is_floating_point
            or (a.shape and b.shape and a.shape != b.shape)
        ):
            return None
        shape = a.shape or b.shape
        n = shape[0] if shape else 1
        av = a.values * n if not a.shape else a.values
        bv = b.values * n if not b.shape else b.values
        f = fn
        if fn is operator.truediv and not a.dtype.is_floating_point:
            if any(v == 0 for v in bv):
                return None
            f = _trunc_div
        return Small(
            shape, tuple(f(x, y) for x, y in zip(av, bv, strict=True)), result_dtype or a.dtype
        )

    return kernel


def _slice(ctx, data, starts=None, ends=None, axes=None, steps=None):
    if (
        starts is None
        or ends is None
        or len(data.shape) != 1
        or (axes is not None and list(axes.values) not in ([0], [-1]))
    ):
        return None
    step = steps.values[0] if steps is not None else 1
    # Python slicing clamps out-of-range bounds the way ONNX Slice does for 1-D data
    return _small(data.values[starts.values[0] : ends.values[0] : step], data.dtype)


def _where(ctx, cond, a, b):
    shapes = {s.shape for s in (cond, a, b) if s.shape}
    if len(shapes) > 1 or a.dtype != b.dtype:
        return None
    shape = shapes.pop() if shapes else ()
    n = shape[0] if shape else 1

    def full(s):
        return s.values * n if not s.shape else s.values

    vals = tuple(x if c else y for c, x, y in zip(full(cond), full(a), full(b), strict=True))
    return Small(shape, vals, a.dtype)


def _identity(ctx, x):
    return x


def _reshape(ctx, data, target):
    dims = list(target.values)
    n = len(data.values)
    if len(dims) > 1:
        return None
    if len(dims) == 0:
        return Small((), data.values, data.dtype) if n == 1 else None
    size = n if dims[0] in (-1, 0) else dims[0]
    return Small((size,), data.values, data.dtype) if size == n else None


def _constant_of_shape(ctx, target):
    value = ctx.attr("value")
    if value is None or value.dtype.is_floating_point or len(target.values) > 1:
        return None
    fill = ctx.attr_values["value"][0]
    if not target.values:
        return Small((), (fill,), value.dtype)
    return Small((target.values[0],), (fill,) * target.values[0], value.dtype)


def const_small(values: tuple | None, shape: tuple | None, dtype: torch.dtype) -> Small | None:
    if values is None or len(shape) > 1:
        return None
    return Small(tuple(shape), values, dtype)


def evaluate(fn, ctx, args) -> Small | None:
    """``fn`` on Python values, or None when it does not apply (the kernel then runs instead)."""
    try:
        out = fn(ctx, *args)
    except (IndexError, ValueError, TypeError, ZeroDivisionError):
        return None
    if out is None or len(out.values) > 64 or (out.values and isinstance(out.values[0], float)):
        return None
    return out


SHAPE_FNS = {
    "Shape": _shape,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Cast": _cast,
    "Add": _elementwise(operator.add),
    "Sub": _elementwise(operator.sub),
    "Mul": _elementwise(operator.mul),
    "Div": _elementwise(operator.truediv),
    "Equal": _elementwise(operator.eq, torch.bool),
    "Less": _elementwise(operator.lt, torch.bool),
    "Greater": _elementwise(operator.gt, torch.bool),
    "Slice": _slice,
    "Where": _where,
    "Identity": _identity,
    "Reshape": _reshape,
    "ConstantOfShape": _constant_of_shape,
}
