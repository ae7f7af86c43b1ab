"""Quantization parameters and the affine quantization arithmetic they define.

``q = clamp(round(x / scale) + zero_point, qmin, qmax)`` and ``x ≈ (q - zero_point) * scale``,
with round-half-to-even as ONNX's QuantizeLinear does. Scale and zero point apply to the whole
tensor, to each slice along ``axis`` (per channel), or to each block of ``block_size`` consecutive
elements along ``axis`` (per group; ONNX ``DequantizeLinear`` with ``block_size``, opset 21).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# (qmin, qmax) per integer type. Symmetric signed ranges drop the lowest code (-128 → -127) so that
# the range is symmetric around zero and negation cannot overflow.
QRANGE: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint4": (0, 15),
    "int4": (-8, 7),
}
# Smallest scale ever produced: a constant-zero tensor must still get a valid positive scale.
MIN_SCALE = 1e-8


@dataclass(frozen=True)
class PerTensor:
    """One scale and zero point for the whole tensor."""


@dataclass(frozen=True)
class PerChannel:
    """One scale and zero point per slice along ``axis``."""

    axis: int = 0


@dataclass(frozen=True)
class PerGroup:
    """One scale and zero point per block of ``block_size`` consecutive elements along ``axis``."""

    axis: int = 0
    block_size: int = 32


Granularity = PerTensor | PerChannel | PerGroup


@dataclass(frozen=True)
class QParams:
    """Scale and zero point of a quantized tensor.

    ``scale`` is float32; ``zero_point`` has the integer type ``dtype``. Both are scalars (per
    tensor), 1-D along ``axis`` (per channel), or shaped like the tensor with ``axis`` divided by
    ``block_size`` (per group).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int | None = None
    block_size: int | None = None

    def __eq__(self, other) -> bool:  # arrays do not compare with dataclass equality
        return (
            isinstance(other, QParams)
            and (self.dtype, self.axis, self.block_size)
            == (other.dtype, other.axis, other.block_size)
            and np.array_equal(self.scale, other.scale)
            and np.array_equal(self.zero_point, other.zero_point)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def range(self) -> tuple[np.ndarray, np.ndarray]:
        """The float values of the lowest and highest codes."""
        qmin, qmax = QRANGE[self.dtype]
        zp = self.zero_point.astype(np.float64)
        return ((qmin - zp) * self.scale, (qmax - zp) * self.scale)


def _np_dtype(dtype: str):
    # int4/uint4 are computed in int8/uint8 containers; the graph stores them packed (ml_dtypes).
    return np.dtype({"int4": "int8", "uint4": "uint8"}.get(dtype, dtype))


def qparams_from_range(
    lo,
    hi,
    *,
    dtype: str = "uint8",
    symmetric: bool = False,
    axis: int | None = None,
    block_size: int | None = None,
) -> QParams:
    """QParams whose range covers ``[lo, hi]`` (arrays for per-channel/per-group), always including 0.

    Symmetric: zero point at the middle code (0 for signed types, 128 for uint8) and
    ``scale = max|x| / qmax``. Asymmetric: the range is stretched to include 0, and the zero point is
    rounded so that 0.0 is represented exactly (zero padding must stay exact).
    """
    if dtype not in QRANGE:
        raise ValueError(f"unsupported quantized type {dtype!r}")
    qmin, qmax = QRANGE[dtype]
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    if symmetric:
        signed = qmin < 0
        half = qmax if signed else (qmax - qmin) / 2
        amax = np.maximum(-lo, hi)
        scale = np.maximum(amax / half, MIN_SCALE)
        zp = np.zeros_like(scale) if signed else np.full_like(scale, (qmax + qmin + 1) // 2)
    else:
        scale = np.maximum((hi - lo) / (qmax - qmin), MIN_SCALE)
        zp = np.clip(np.round(qmin - lo / scale), qmin, qmax)
    return QParams(
        scale=scale.astype(np.float32),
        zero_point=zp.astype(_np_dtype(dtype)),
        dtype=dtype,
        axis=axis,
        block_size=block_size,
    )


def _broadcast(p: np.ndarray, qp: QParams, ndim: int) -> np.ndarray:
    if qp.axis is None or p.ndim == 0:
        return p
    axis = qp.axis % ndim
    if qp.block_size:
        return np.repeat(p, qp.block_size, axis=axis)
    shape = [1] * ndim
    shape[axis] = -1
    return p.reshape(shape)


def quantize(x: np.ndarray, qp: QParams) -> np.ndarray:
    """The integer codes of ``x`` (int4 types are returned in int8/uint8 containers)."""
    qmin, qmax = QRANGE[qp.dtype]
    x = np.asarray(x, dtype=np.float32)
    scale = _broadcast(qp.scale, qp, x.ndim)
    zp = _broadcast(qp.zero_point.astype(np.float32), qp, x.ndim)
    q = np.rint(x / scale) + zp  # np.rint rounds half to even, as QuantizeLinear does
    return np.clip(q, qmin, qmax).astype(_np_dtype(qp.dtype))


def dequantize(q: np.ndarray, qp: QParams) -> np.ndarray:
    q = np.asarray(q)
    scale = _broadcast(qp.scale, qp, q.ndim)
    zp = _broadcast(qp.zero_point.astype(np.float32), qp, q.ndim)
    return ((q.astype(np.float32) - zp) * scale).astype(np.float32)


def fake_quantize(x: np.ndarray, qp: QParams) -> np.ndarray:
    return dequantize(quantize(x, qp), qp)


def reduce_range(
    x: np.ndarray, granularity: Granularity
) -> tuple[np.ndarray, np.ndarray, int | None, int | None]:
    """Min and max of ``x`` at ``granularity``: ``(lo, hi, axis, block_size)``.

    Per group, the axis length must be a multiple of the block size (callers pad or refuse).
    """
    x = np.asarray(x, dtype=np.float32)
    if isinstance(granularity, PerTensor) or x.ndim == 0:
        return np.asarray(x.min()), np.asarray(x.max()), None, None
    axis = granularity.axis % x.ndim
    if isinstance(granularity, PerChannel):
        other = tuple(i for i in range(x.ndim) if i != axis)
        return x.min(axis=other), x.max(axis=other), axis, None
    b = granularity.block_size
    n = x.shape[axis]
    if n % b:
        raise ValueError(f"axis {axis} of length {n} is not a multiple of block size {b}")
    shape = list(x.shape)
    shape[axis : axis + 1] = [n // b, b]
    blocks = x.reshape(shape)
    return blocks.min(axis=axis + 1), blocks.max(axis=axis + 1), axis, b


def weight_qparams(
    w: np.ndarray,
    granularity: Granularity,
    *,
    dtype: str = "int8",
    symmetric: bool = True,
    method: str = "minmax",
) -> QParams:
    """QParams for a constant weight: its min/max, or (``method="mse"``) the clip that minimises
    the squared rounding + clipping error, searched per channel/group on a grid of shrink factors."""
    lo, hi, axis, block = reduce_range(w, granularity)
    if method == "minmax":
        return qparams_from_range(
            lo, hi, dtype=dtype, symmetric=symmetric, axis=axis, block_size=block
        )
    best = None
    best_err = None
    for shrink in np.linspace(1.0, 0.5, 26):
        qp = qparams_from_range(
            lo * shrink, hi * shrink, dtype=dtype, symmetric=symmetric, axis=axis, block_size=block
        )
        err = np.square(fake_quantize(w, qp) - w)
        err_r = _reduce_err(err, axis, block)
        if best is None:
            best, best_err, best_shrink = qp, err_r, np.full_like(err_r, shrink)
        else:
            better = err_r < best_err
            best_err = np.where(better, err_r, best_err)
            best_shrink = np.where(better, shrink, best_shrink)
    if best_shrink.ndim and axis is not None:
        shape = best_shrink.shape
        lo_b, hi_b = lo * best_shrink.reshape(shape), hi * best_shrink.reshape(shape)
    else:
        lo_b, hi_b = lo * best_shrink, hi * best_shrink
    return qparams_from_range(
        lo_b, hi_b, dtype=dtype, symmetric=symmetric, axis=axis, block_size=block
    )


def _reduce_err(err: np.ndarray, axis: int | None, block: int | None) -> np.ndarray:
    if axis is None:
        return np.asarray(err.sum())
    if block is None:
        other = tuple(i for i in range(err.ndim) if i != axis)
        return err.sum(axis=other)
    shape = list(err.shape)
    shape[axis : axis + 1] = [shape[axis] // block, block]
    return err.reshape(shape).sum(axis=axis + 1)
