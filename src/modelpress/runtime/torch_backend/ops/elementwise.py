"""Elementwise arithmetic, comparison, logic and casts (numpy-style broadcasting, as in ONNX)."""

from __future__ import annotations

import functools
import math

import torch

from modelpress.runtime.torch_backend.registry import op, torch_dtype

_UNARY = {
    "Abs": torch.abs,
    "Neg": torch.neg,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Exp": torch.exp,
    "Log": torch.log,
    "Ceil": torch.ceil,
    "Floor": torch.floor,
    "Round": torch.round,  # half to even, as ONNX
    "Sign": torch.sign,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Asinh": torch.asinh,
    "Acosh": torch.acosh,
    "Atanh": torch.atanh,
    "Erf": torch.erf,
    "IsNaN": torch.isnan,
    "Not": torch.logical_not,
}


def unary(fn):
    """The kernel of an op that is ``fn`` of its one input."""
    return lambda ctx, x: fn(x)


for _name, _fn in _UNARY.items():
    op(_name)(unary(_fn))

_BINARY = {
    "Add": torch.add,
    "Sub": torch.sub,
    "Mul": torch.mul,
    "Equal": torch.eq,
    "Greater": torch.gt,
    "Less": torch.lt,
    "GreaterOrEqual": torch.ge,
    "LessOrEqual": torch.le,
    "And": torch.logical_and,
    "Or": torch.logical_or,
    "Xor": torch.logical_xor,
    "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
}


# torch has few CPU kernels for uint16/32/64; compute those in int64 (exact below 2**63) and cast
# the result back, which also wraps Add/Sub/Mul around as unsigned arithmetic does.
_UNSIGNED_WIDE = {torch.uint16, torch.uint32, torch.uint64}


def _widened(fn):
    def call(a, b):
        if a.dtype in _UNSIGNED_WIDE:
            out = fn(a.to(torch.int64), b.to(torch.int64))
            return out if out.dtype == torch.bool else out.to(a.dtype)
        return fn(a, b)

    return call


def _binary(fn):
    fn = _widened(fn)
    return lambda ctx, a, b: fn(a, b)


for _name, _fn in _BINARY.items():
    op(_name)(_binary(_fn))


@op("Div")
def div(ctx, a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return a / b
    return _widened(lambda p, q: torch.div(p, q, rounding_mode="trunc"))(a, b)  # C-style division


@op("Pow")
def pow_(ctx, a, b):
    # The result has the base's type, whatever the exponent's type.
    if ctx.consts[1] is not None and b.dim() == 0 and a.dtype.is_floating_point:
        return a ** ctx.consts[1][0]  # a Python exponent (x ** 2 becomes a multiply)
    if not a.dtype.is_floating_point and b.dtype.is_floating_point:
        return torch.pow(a.to(b.dtype), b).to(a.dtype)
    return torch.pow(a, b).to(a.dtype)


@op("Mod")
def mod(ctx, a, b):
    if ctx.attr("fmod", 0):
        return _widened(torch.fmod)(a, b)
    return _widened(torch.remainder)(a, b)  # the sign of the divisor, as Python's %


@op("BitShift")
def bitshift(ctx, a, b):
    if ctx.attr("direction") == "LEFT":
        return _widened(torch.bitwise_left_shift)(a, b)
    return _widened(torch.bitwise_right_shift)(a, b)


@op("BitwiseNot")
def bitwise_not(ctx, x):
    if x.dtype in _UNSIGNED_WIDE:
        return torch.bitwise_not(x.to(torch.int64)).to(x.dtype)
    return torch.bitwise_not(x)


def _variadic(fn):
    fn = _widened(fn)
    return lambda ctx, *xs: functools.reduce(fn, xs)


op("Max")(_variadic(torch.maximum))
op("Min")(_variadic(torch.minimum))
op("Sum")(_variadic(torch.add))


@op("Mean")
def mean(ctx, *xs):
    return functools.reduce(torch.add, xs) / len(xs)


@op("Where")
def where(ctx, cond, a, b):
    return torch.where(cond, a, b)


@op("IsInf")
def isinf(ctx, x):
    neg = ctx.attr("detect_negative", 1)
    pos = ctx.attr("detect_positive", 1)
    if neg and pos:
        return torch.isinf(x)
    if pos:
        return torch.isposinf(x)
    if neg:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


@op("Identity")
def identity(ctx, x):
    return x


FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
_MANTISSA_BITS = dict(zip(FLOAT8, (3, 2, 3, 2), strict=True))


def to_float8(x, dtype, saturate: bool):
    """``x`` cast to a float8 ``dtype`` by ONNX's rules, the same on every device (PyTorch's own
    cast saturates on the CPU and does not on CUDA).

    Rounding is to nearest even. With ``saturate`` a value past the largest finite one becomes it
    (an infinity too); without, it becomes infinity in E5M2 and NaN in the types with none.
    """
    v = x.to(torch.float32)
    top = float(torch.finfo(dtype).max)
    clamped = torch.clamp(v, -top, top)  # NaN stays NaN
    if saturate:
        return clamped.to(dtype)
    # past the largest finite value once rounded: beyond half a step above it, or at that tie
    # when the largest value's mantissa is odd (ties go to even, here the next binade)
    binade = 2.0 ** math.floor(math.log2(top))
    step = binade * 2.0 ** -_MANTISSA_BITS[dtype]
    odd = round((top - binade) / step) % 2 == 1
    bound = top + step / 2
    over = v.abs() >= bound if odd else v.abs() > bound
    special = (
        torch.copysign(torch.full_like(v, torch.inf), v)
        if dtype == torch.float8_e5m2
        else (torch.full_like(v, torch.nan))
    )
    return torch.where(over, special, clamped).to(dtype)


def _cast(ctx, x, dtype):
    if dtype in FLOAT8:
        return to_float8(x, dtype, bool(ctx.attr("saturate", 1)))
    return x.to(dtype)


@op("Cast")
def cast(ctx, x):
    return _cast(ctx, x, torch_dtype(ctx.attr("to"), ctx))


@op("CastLike")
def cast_like(ctx, x, like):
    return _cast(ctx, x, like.dtype)


@op("Clip")
def clip(ctx, x, lo=None, hi=None):
    if ctx.opset < 11:
        lo_v, hi_v = ctx.attr("min"), ctx.attr("max")
        return x if lo_v is None and hi_v is None else torch.clamp(x, lo_v, hi_v)
    if lo is not None and hi is not None:
        return torch.minimum(torch.maximum(x, lo), hi)
    if lo is not None:
        return torch.maximum(x, lo)
    if hi is not None:
        return torch.minimum(x, hi)
    return x


@op("Dropout")
def dropout(ctx, x, ratio=None, training_mode=None):
    # Inference semantics unless the graph itself asks for training (see module.py for why
    # module.train() does not change it).
    if training_mode is not None and bool(ctx.scalar(2, training_mode)):
        p = 0.5 if ratio is None else float(ctx.scalar(1, ratio))
        keep = torch.rand_like(x, dtype=torch.float32) >= p
        y = x * keep / (1 - p) if p < 1 else torch.zeros_like(x)
        return (y, keep) if ctx.num_outputs > 1 else y
    if ctx.num_outputs > 1:
        return x, torch.ones_like(x, dtype=torch.bool)
    return x
