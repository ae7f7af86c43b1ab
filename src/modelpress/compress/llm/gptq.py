"""GPTQ on a fixed block grid, with act-order.

Frantar et al. 2022. For ``y = x @ W``, ``W [K, N]``, the rows of ``W`` are rounded one at a time
and each row's rounding error is spread over the rows not yet rounded through the inverse of
``H = XᵀX / rows`` (dampened by ``DAMP`` of its mean diagonal), which lowers the layer's output
error ``tr(DᵀHD)`` below rounding to nearest.

Rules of this version:
- The grid (each block's scale and zero point, ``grid.block_grid`` with its clip search) is
  fixed before the rows are solved ("static groups"), so the blocks stay the contiguous runs of
  ``K`` that ``MatMulNBits`` stores, whatever the order the rows are solved in.
- ``act_order``: rows are solved in decreasing ``H_kk`` (the inputs with the most energy first,
  while the most rows are left to take their error); without it, in ``K`` order.
- A channel never active in calibration (``H_kk = 0``) takes the mean diagonal, so it is rounded
  to nearest and passes nothing on.
- Updates beyond the current chunk of ``CHUNK`` rows are applied once per chunk (the paper's
  lazy batch update): the same result with matrix products.
"""

from __future__ import annotations

import numpy as np

DAMP = 0.01
CHUNK = 128


def _inverse_cholesky_upper(h: np.ndarray) -> np.ndarray:
    """Upper ``U`` with ``H⁻¹ = UᵀU``."""
    hinv = np.linalg.inv(h)
    return np.linalg.cholesky(hinv).T


def gptq_codes(
    w: np.ndarray,
    h: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None,
    *,
    bits: int,
    block_size: int,
    act_order: bool = False,
    damp: float = DAMP,
) -> np.ndarray:
    """Unsigned codes ``[K, N]`` of ``w`` on the grid ``scale``/``zp`` ``[n_blocks, N]``."""
    k, n = w.shape
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    diag = np.diag(h).copy()
    dead = diag <= 0
    live_mean = float(diag[~dead].mean()) if (~dead).any() else 1.0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = live_mean
    h[np.arange(k), np.arange(k)] += damp * float(np.mean(np.diag(h)))
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    w = w[order]
    h = h[np.ix_(order, order)]
    u = _inverse_cholesky_upper(h)
    block_of = order // block_size
    row_scale = scale[block_of].astype(np.float64)  # [K, N] in solve order
    row_zp = (
        np.full((k, n), 2 ** (bits - 1), np.float64)
        if zp is None
        else zp[block_of].astype(np.float64)
    )
    qmax = 2**bits - 1
    codes = np.zeros((k, n), np.uint8)
    for c0 in range(0, k, CHUNK):
        c1 = min(c0 + CHUNK, k)
        wc = w[c0:c1]
        err = np.zeros_like(wc)
        for j in range(c1 - c0):
            r = c0 + j
            s, z = row_scale[r], row_zp[r]
            q = np.clip(np.round(wc[j] / s) + z, 0, qmax)
            codes[r] = q
            e = (wc[j] - (q - z) * s) / u[r, r]
            wc[j + 1 :] -= np.outer(u[r, r + 1 : c1], e)
            err[j] = e
        w[c1:] -= u[c0:c1, c1:].T @ err
    out = np.empty_like(codes)
    out[order] = codes
    return out
