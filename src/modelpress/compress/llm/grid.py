"""Block grids: the scale and zero point of each block of a weight, and rounding onto them.

``W [K, N]`` (``y = x @ W``) is cut into blocks of ``block_size`` rows along ``K`` per column
(``ir.nbits``); ``K`` not a multiple of the block size gets a last, shorter block (zero rows
added for the arithmetic, never stored; a grid is fitted to the block's real rows). An element stands for
``(q - z) * s``, ``q`` its unsigned code. The zero point ``z`` takes one of three forms:

- ``"float"`` (asymmetric, ``MatMulNBits``' float zero points): ``s = (max - min) / (2**bits - 1)``,
  ``z = -min / s``: the block's own range, 0 need not be in it, and the extreme values land
  exactly on the extreme codes (GGUF's Q4_1 blocks are reproduced).
- ``"integer"`` (asymmetric, a code of the weight's type: ``DequantizeLinear``): the range is
  widened to include 0 and ``z = round(-min / s)`` in ``[0, 2**bits - 1]``.
- ``"symmetric"``: ``s = absmax / (2**(bits-1) - 0.5)`` with the implicit zero point ``2**(bits-1)``:
  the signed codes ``-2**(bits-1) .. 2**(bits-1) - 1`` all in use, the largest magnitude lands
  on the extreme code of its sign (rounded half to even), no wasted level.

Without calibration (``h=None``) those min/max grids are the result (round to nearest, RTN).

With ``h = XᵀX / rows`` (``block_grid(h=...)``) each block and column searches its grid for the
least output error on its own rows, ``dᵀ H_bb d`` (``d`` the rounding error of the block's
column, ``H_bb`` the block's diagonal block of ``H``). Candidates: the two ends of the range
shrunk independently (``lo·a``, ``hi·b`` for ``a, b`` in ``CLIP_RATIOS``); from each, ``REFITS``
rounds of a least-squares refit of the grid to the codes just rounded, weighted by the inputs'
energy ``H_kk`` (the scale and offset jointly for float zero points; the scale for the integer
forms, the integer zero point rounded from the joint fit first), then rounding again. Every
rounding is a candidate and the plain min/max grid is the first, so the search never has more
error than RTN on the data it is given. (The idea of llama.cpp's importance-weighted k-quant
search and of HQQ's refit: the best grid for codes is a weighted least-squares problem.)
"""

from __future__ import annotations

import numpy as np

from modelpress.ir.nbits import Blocks

FORMS = ("float", "integer", "symmetric")
CLIP_RATIOS = (1.0, 0.9, 0.8, 0.7)
REFITS = 2
COLUMNS = 128


def _blocked(w: np.ndarray, block_size: int, *, edge: bool = False) -> np.ndarray:
    """``W [K, N]`` → ``[n_blocks, block_size, N]``, rows appended to fill the last block: zeros,
    or (``edge``, for fitting a grid) copies of the last row, which leave its range as it is."""
    k, n = w.shape
    nb = -(-k // block_size)
    if nb * block_size != k:
        fill = np.repeat(w[-1:], nb * block_size - k, 0) if edge else np.zeros((1, n), w.dtype)
        w = np.concatenate([w, np.broadcast_to(fill, (nb * block_size - k, n))])
    return w.reshape(nb, block_size, n)


def zero_point_form(*, symmetric: bool, float_zero_point: bool) -> str:
    if symmetric:
        return "symmetric"
    return "float" if float_zero_point else "integer"


def _safe(scale: np.ndarray) -> np.ndarray:
    return np.where(scale > 0, scale, 1e-8).astype(np.float32)  # an all-zero block


def _grid_from_range(lo, hi, bits: int, form: str):
    """``(scale, zero point)`` of the ranges ``[lo, hi]``; the zero point is ``None`` when
    symmetric, float (integer-valued for ``"integer"``) otherwise."""
    qmax = 2**bits - 1
    if form == "symmetric":
        amax = np.maximum(np.abs(lo), np.abs(hi))
        return _safe(amax / (2 ** (bits - 1) - 0.5)), None
    if form == "integer":
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    scale = _safe((hi - lo) / qmax)
    zp = -lo / scale
    if form == "integer":
        zp = np.clip(np.round(zp), 0, qmax)
    return scale, zp.astype(np.float32)


def _round(wb, scale, zp, bits):
    """Codes (float) of blocked weights ``[nb, bs, N]`` on the grid ``[nb, N]``."""
    z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
    return np.clip(np.round(wb / scale[:, None, :] + z), 0, 2**bits - 1)


def _error(wb, q, scale, zp, bits, imp, hbb):
    z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
    d = (q - z) * scale[:, None, :] - wb  # [nb, bs, N]
    if hbb is not None:
        return np.sum(np.matmul(hbb, d) * d, axis=1)
    return np.sum(imp * d * d, axis=1)


def _refit(wb, q, scale, zp, bits, form, imp):
    """Weighted least-squares grid of the codes ``q`` (module docstring); where the fit is
    degenerate (one distinct code, a non-positive scale) the grid is kept."""
    qmax = 2**bits - 1
    sw = imp.sum(axis=1)
    sx = np.sum(imp * wb, axis=1)
    if form != "symmetric":
        sq = np.sum(imp * q, axis=1)
        sqq = np.sum(imp * q * q, axis=1)
        sqx = np.sum(imp * q * wb, axis=1)
        det = sw * sqq - sq * sq
        ok = det > 1e-12 * np.maximum(sw * sqq, 1e-30)
        det = np.where(ok, det, 1)
        s = (sw * sqx - sq * sx) / det
        m = (sqq * sx - sq * sqx) / det
        ok &= s > 0
        s_safe = np.where(ok, s, 1)
        if form == "float":
            new_s = np.where(ok, s, scale).astype(np.float32)
            return new_s, np.where(ok, -m / s_safe, zp).astype(np.float32)
        zp = np.where(ok, np.clip(np.round(-m / s_safe), 0, qmax), zp).astype(np.float32)
    t = q - (2 ** (bits - 1) if zp is None else zp[:, None, :])
    num = np.sum(imp * t * wb, axis=1)
    den = np.sum(imp * t * t, axis=1)
    s = num / np.where(den > 0, den, 1)
    ok = (den > 0) & (s > 0)
    return np.where(ok, s, scale).astype(np.float32), zp


def _diag_blocks(h: np.ndarray, block_size: int, k: int) -> np.ndarray:
    """The diagonal blocks ``H_bb`` of ``H [K, K]``: ``[n_blocks, block_size, block_size]``."""
    nb = -(-k // block_size)
    out = np.zeros((nb, block_size, block_size), np.float32)
    for b in range(nb):
        r = slice(b * block_size, min((b + 1) * block_size, k))
        m = r.stop - r.start
        out[b, :m, :m] = h[r, r]
    return out


def fit_blocks(
    wb: np.ndarray,
    *,
    bits: int,
    form: str,
    hbb: np.ndarray | None = None,
    ratios: tuple[float, ...] = CLIP_RATIOS,
    refits: int = REFITS,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(scale, zero point)`` ``[nb, N]`` of blocked weights ``wb [nb, bs, N]``: min/max without
    ``hbb``, searched against ``hbb [nb, bs, bs]`` with it (module docstring)."""
    wb = np.asarray(wb, np.float32)
    n = wb.shape[2]
    if hbb is not None and n > COLUMNS:  # the search a slice of columns at a time: in cache
        parts = [
            fit_blocks(
                wb[:, :, c : c + COLUMNS],
                bits=bits,
                form=form,
                hbb=hbb,
                ratios=ratios,
                refits=refits,
            )
            for c in range(0, n, COLUMNS)
        ]
        zps = [p[1] for p in parts]
        return (
            np.concatenate([p[0] for p in parts], axis=1),
            None if zps[0] is None else np.concatenate(zps, axis=1),
        )
    lo, hi = wb.min(axis=1), wb.max(axis=1)
    best = _grid_from_range(lo, hi, bits, form)
    if hbb is None:
        return best
    hbb = np.asarray(hbb, np.float32)
    imp = np.diagonal(hbb, axis1=1, axis2=2)[:, :, None].astype(np.float32)  # [nb, bs, 1]
    # a block whose inputs never fired: weigh its rows equally (zero rows of a short block stay 0)
    dead = imp.sum(axis=1, keepdims=True) <= 0
    imp = np.where(dead, 1.0, imp).astype(np.float32)
    best_err = _error(wb, _round(wb, *best, bits), *best, bits, imp, hbb)
    pairs = [(1.0, 1.0)] if form == "symmetric" else [(a, b) for a in ratios for b in ratios]
    if form == "symmetric":
        pairs += [(r, r) for r in ratios[1:]]
    for a, b in pairs:
        grid = _grid_from_range(lo * a, hi * b, bits, form)
        for step in range(refits + 1):
            q = _round(wb, *grid, bits)
            if step or (a, b) != (1.0, 1.0):
                err = _error(wb, q, *grid, bits, imp, hbb)
                better = err < best_err
                best_err = np.where(better, err, best_err)
                best = (
                    np.where(better, grid[0], best[0]),
                    None if grid[1] is None else np.where(better, grid[1], best[1]),
                )
            if step < refits:
                grid = _refit(wb, q, *grid, bits, form, imp)
    return best


def block_grid(
    w: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    float_zero_point: bool = False,
    h: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(scale, zero_point)`` ``[n_blocks, N]`` of ``w`` (module docstring); the zero point is
    ``None`` when symmetric, float32 otherwise (integer-valued unless ``float_zero_point``)."""
    w = np.asarray(w, np.float32)
    form = zero_point_form(symmetric=symmetric, float_zero_point=float_zero_point)
    hbb = None if h is None else _diag_blocks(np.asarray(h), block_size, w.shape[0])
    return fit_blocks(_blocked(w, block_size, edge=True), bits=bits, form=form, hbb=hbb)


def codes_on_grid(
    w: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, bits: int, block_size: int
) -> np.ndarray:
    """Unsigned codes ``[K, N]`` of ``w`` rounded to nearest on the grid ``scale``/``zp``
    (``[n_blocks, N]``)."""
    k = w.shape[0]
    q = _round(_blocked(np.asarray(w, np.float32), block_size), scale, zp, bits)
    return q.reshape(-1, w.shape[1])[:k].astype(np.uint8)


def dequantize_codes(
    codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, bits: int, block_size: int
) -> np.ndarray:
    k = codes.shape[0]
    z = 2 ** (bits - 1) if zp is None else zp[:, None, :]
    q = _blocked(codes.astype(np.float32), block_size)
    return ((q - z) * scale[:, None, :]).reshape(-1, codes.shape[1])[:k]


def to_blocks(
    codes: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None,
    bits: int,
    block_size: int,
    *,
    float_zero_point: bool = False,
) -> Blocks:
    """``[K, N]`` codes and ``[n_blocks, N]`` grid → ``Blocks`` (``[N, ...]`` orientation)."""
    if zp is not None:
        zp = np.ascontiguousarray(zp.T, np.float32 if float_zero_point else np.uint8)
    return Blocks(
        np.ascontiguousarray(codes.T, np.uint8),
        np.ascontiguousarray(scale.T, np.float32),
        zp,
        bits,
        block_size,
    )
