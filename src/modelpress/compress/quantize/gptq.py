"""GPTQ: 4-bit weights rounded so that the layer's output on real inputs changes least.

Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers". For ``y = x @ W`` with ``W`` of shape ``[K, N]``, the output error of a quantized
``Ŵ`` on inputs ``X`` is ``‖X (W − Ŵ)‖² = tr((W − Ŵ)ᵀ H (W − Ŵ))`` with ``H = XᵀX``. Rows of ``W``
(the reduction axis ``K``) are quantized one at a time, in order; the rounding error of row ``k``
is spread over the rows not yet quantized through the inverse Hessian, which is what makes the
sum of errors smaller than rounding each row to nearest (RTN).

Rules:
- ``H`` is accumulated over calibration batches (``HessianObserver``: fixed ``K×K`` state, memory
  does not grow with the number of samples) and dampened by 1% of its mean diagonal so that the
  inverse exists; an input channel that is always zero gets ``H_kk = 1``: its row is rounded to nearest and
  passes no error on (the channel may well be active on other data).
- The inverse Hessian is used in its upper Cholesky form ``H⁻¹ = UᵀU``: row ``k``'s error divided
  by ``U_kk`` times ``U_k,k+1:`` is the optimal update of the later rows.
- The scale and zero point of each block of ``block_size`` rows are chosen (asymmetric, MSE clip
  search) from the weights as updated when the block starts, so they cover the compensated values.
- Updates to rows outside the current chunk of rows are applied once per chunk (lazy batch
  update, the paper's §4 "Step 2"): the same result, with matrix products instead of row loops.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.qparams import (
    PerGroup,
    QParams,
    dequantize,
    quantize,
    weight_qparams,
)

DAMP = 0.01  # fraction of the mean diagonal added to H
CHUNK = 128  # rows per lazy-update chunk (a multiple of every power-of-two block size ≤ 128)


class HessianObserver:
    """``observe(x)`` adds ``XᵀX`` of ``x``'s rows (last axis = the layer's reduction axis)."""

    def __init__(self) -> None:
        self.xtx: np.ndarray | None = None
        self.rows = 0

    def observe(self, x: np.ndarray) -> None:
        x2 = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
        if self.xtx is None:
            self.xtx = np.zeros((x2.shape[1], x2.shape[1]))
        self.xtx += x2.T @ x2
        self.rows += x2.shape[0]

    def hessian(self) -> np.ndarray:
        """``XᵀX / rows`` (the scale does not change GPTQ's result, only keeps numbers tame)."""
        if self.xtx is None:
            raise ValueError("no data observed")
        return self.xtx / max(self.rows, 1)


def inverse_cholesky(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """Upper-triangular ``U`` with ``(H + λI)⁻¹ = UᵀU``, ``λ = damp · mean(diag H)``."""
    h = np.array(h, dtype=np.float64)
    idx = np.arange(len(h))
    h[idx, idx] += damp * max(float(np.mean(np.diag(h))), 1e-12)
    lower = np.linalg.cholesky(h)
    lower_inv = np.linalg.solve(lower, np.eye(len(h)))
    h_inv = lower_inv.T @ lower_inv
    return np.linalg.cholesky(h_inv).T


def gptq(
    w: np.ndarray,
    h: np.ndarray,
    *,
    block_size: int,
    dtype: str = "uint4",
    damp: float = DAMP,
) -> tuple[np.ndarray, QParams]:
    """Integer codes and block QParams (``axis=0``) for ``W [K, N]`` given ``H = XᵀX [K, K]``.

    ``K`` must be a multiple of ``block_size``; ``dequantize(codes, qp)`` is ``Ŵ``.
    """
    k, n = w.shape
    if k % block_size:
        raise ValueError(f"reduction axis {k} is not a multiple of block size {block_size}")
    w = np.array(w, dtype=np.float64)
    h = np.array(h, dtype=np.float64)
    dead = np.diag(h) == 0  # a channel never active in calibration: decoupled, plainly rounded
    h[dead, dead] = 1.0
    u = inverse_cholesky(h, damp)
    chunk = max(CHUNK - CHUNK % block_size, block_size)
    codes = np.zeros((k, n), dtype=np.int16)
    scales = np.zeros((k // block_size, n), np.float32)
    zero_points = np.zeros((k // block_size, n), np.int16)
    qp_row = None
    for c0 in range(0, k, chunk):
        c1 = min(c0 + chunk, k)
        wc = w[c0:c1]  # a view: updates land in w
        err = np.zeros_like(wc)
        for j in range(c1 - c0):
            row = c0 + j
            if row % block_size == 0:
                qp_block = weight_qparams(
                    wc[j : j + block_size].astype(np.float32),
                    PerGroup(0, block_size),
                    dtype=dtype,
                    symmetric=False,
                    method="mse",
                )
                b = row // block_size
                scales[b], zero_points[b] = qp_block.scale[0], qp_block.zero_point[0]
                qp_row = QParams(qp_block.scale[0], qp_block.zero_point[0], dtype, axis=1)
            q = quantize(wc[j : j + 1], qp_row)
            codes[row] = q[0]
            e = (wc[j] - dequantize(q, qp_row)[0]) / u[row, row]
            wc[j + 1 :] -= np.outer(u[row, row + 1 : c1], e)
            err[j] = e
        w[c1:] -= u[c0:c1, c1:].T @ err
    container = quantize(np.zeros(1, np.float32), qp_row).dtype
    qp = QParams(scales, zero_points.astype(container), dtype, axis=0, block_size=block_size)
    return codes.astype(container), qp
