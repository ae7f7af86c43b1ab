"""Block grids: the scale and zero point of each block of a weight, and rounding onto them.

``W [K, N]`` (``y = x @ W``) is cut into blocks of ``block_size`` rows along ``K`` per column
(``ir.nbits``); ``K`` not a multiple of the block size gets a last, shorter block (zero rows
added for the arithmetic, never stored).

- asymmetric (``symmetric=False``): ``s = (max - min) / (2**bits - 1)``, integer zero point
  ``z = round(-min / s)`` in ``[0, 2**bits - 1]``; the block's range always includes 0.
- symmetric: ``s = absmax / (2**(bits-1) - 0.5)`` with the implicit zero point ``2**(bits-1)``:
  the signed codes ``-2**(bits-1) .. 2**(bits-1) - 1`` all in use, the largest magnitude lands
  on the extreme code of its sign (rounded half to even), no wasted level.
- clipping search (``h`` given): each block's range is shrunk by a ratio in ``CLIP_RATIOS``, the
  ratio kept per block and column being the one with the least output error on the block's own
  rows, ``dᵀ H_bb d`` (``d`` the rounding error of the block's column, ``H_bb`` its diagonal
  block of ``H = XᵀX / rows``): the AWQ paper's clip search, on the layer's calibration inputs
  instead of weights alone. ``h=None``: min/max ranges (plain round to nearest, RTN).
"""

from __future__ import annotations

import numpy as np

from modelpress.ir.nbits import Blocks

CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)


def _blocked(w: np.ndarray, block_size: int) -> np.ndarray:
    """``W [K, N]`` → ``[n_blocks, block_size, N]`` (zero rows appended to fill the last block)."""
    k, n = w.shape
    nb = -(-k // block_size)
    if nb * block_size != k:
        w = np.concatenate([w, np.zeros((nb * block_size - k, n), w.dtype)])
    return w.reshape(nb, block_size, n)


def _grid_from_range(lo, hi, bits: int, symmetric: bool):
    qmax = 2**bits - 1
    if symmetric:
        amax = np.maximum(np.abs(lo), np.abs(hi))
        scale = amax / (2 ** (bits - 1) - 0.5)
        zp = None
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scale = (hi - lo) / qmax
        safe = np.where(scale > 0, scale, 1)
        zp = np.clip(np.round(-lo / safe), 0, qmax)
    scale = np.where(scale > 0, scale, 1e-8).astype(np.float32)  # an all-zero block
    return scale, zp


def codes_on_grid(
    w: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, bits: int, block_size: int
) -> np.ndarray:
    """Unsigned codes ``[K, N]`` of ``w`` rounded to nearest on the grid ``scale``/``zp``
    (``[n_blocks, N]``)."""
    k = w.shape[0]
    z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
    q = np.round(_blocked(w, block_size) / scale[:, None, :]) + z
    return np.clip(q, 0, 2**bits - 1).reshape(-1, w.shape[1])[:k].astype(np.uint8)


def dequantize_codes(
    codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, bits: int, block_size: int
) -> np.ndarray:
    k = codes.shape[0]
    z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
    q = _blocked(codes.astype(np.float32), block_size)
    return ((q - z) * scale[:, None, :]).reshape(-1, codes.shape[1])[:k]


def block_grid(
    w: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    h: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(scale, zero_point)`` ``[n_blocks, N]`` of ``w`` (module docstring); the zero point is
    ``None`` when symmetric."""
    wb = _blocked(np.asarray(w, np.float32), block_size)
    lo, hi = wb.min(axis=1), wb.max(axis=1)
    best = _grid_from_range(lo, hi, bits, symmetric)
    if h is None:
        return best
    nb = wb.shape[0]
    hb = _blocked(np.asarray(h, np.float32), block_size)  # [nb, bs, K]
    hbb = np.stack([hb[b, :, b * block_size : (b + 1) * block_size] for b in range(nb)])
    if hbb.shape[-1] < block_size:  # the short last block: pad H_bb with zeros
        pad = np.zeros((nb, block_size, block_size), np.float32)
        pad[:, :, : hbb.shape[-1]] = hbb
        hbb = pad
    best_err = None
    for r in CLIP_RATIOS:
        scale, zp = _grid_from_range(lo * r, hi * r, bits, symmetric)
        z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
        q = np.clip(np.round(wb / scale[:, None, :]) + z, 0, 2**bits - 1)
        d = (q - z) * scale[:, None, :] - wb  # [nb, bs, N]
        err = np.sum(np.matmul(hbb, d) * d, axis=1)  # dᵀ H_bb d per block and column
        if best_err is None:
            best_err, best = err, (scale, zp)
            continue
        better = err < best_err
        best_err = np.where(better, err, best_err)
        s0, z0 = best
        best = (
            np.where(better, scale, s0),
            None if zp is None else np.where(better, zp, z0),
        )
    return best


def to_blocks(
    codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, bits: int, block_size: int
) -> Blocks:
    """``[K, N]`` codes and ``[n_blocks, N]`` grid → ``Blocks`` (``[N, ...]`` orientation)."""
    return Blocks(
        np.ascontiguousarray(codes.T, np.uint8),
        np.ascontiguousarray(scale.T, np.float32),
        None if zp is None else np.ascontiguousarray(zp.T, np.uint8),
        bits,
        block_size,
    )


def output_error(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> float:
    """``‖X(W − Ŵ)‖² / rows = tr((W − Ŵ)ᵀ H (W − Ŵ))`` for ``H = XᵀX / rows``."""
    d = np.asarray(w_hat, np.float64) - w
    return float(np.sum((np.asarray(h, np.float64) @ d) * d))
