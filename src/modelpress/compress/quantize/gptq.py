"""GPTQ: weights rounded so that the layer's output on real inputs changes least.

Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers". For ``y = x @ W`` with ``W`` of shape ``[K, N]``, the output error of a quantized
``Ŵ`` on inputs ``X`` is ``‖X (W − Ŵ)‖² = tr((W − Ŵ)ᵀ H (W − Ŵ))`` with ``H = XᵀX``. Rows of ``W``
(the reduction axis ``K``) are quantized one at a time, in order; the rounding error of row ``k``
is spread over the rows not yet quantized through the inverse Hessian, which is what makes the
sum of errors smaller than rounding each row to nearest (RTN).

Two uses: 4-bit blocks (weight-only mode, ``weight_only.gptq_quantize``) and int8 weights (static
mode, and weight-only int8 with calibration data: ``round_layers``, one fixed symmetric scale per
output channel, the grid ONNX Runtime's int8 kernels use). A convolution is a product too: ``X``
is then the matrix of its input patches (im2col, ``InputHessian``), one per group (what it gains,
measured: ``docs/defaults.md``).

Rules:
- ``H`` is accumulated over calibration batches (``HessianObserver``, ``InputHessian``: fixed
  ``K×K`` state, memory does not grow with the number of samples; an int8 layer takes at most
  ``MAX_ROWS`` rows per batch, drawn at random) and dampened by 1% of its mean diagonal so
  that the inverse exists; an input channel that is always zero gets ``H_kk = 1``: its row is
  rounded to nearest and passes no error on (the channel may well be active on other data).
- The inverse Hessian is used in its upper Cholesky form ``H⁻¹ = UᵀU``: row ``k``'s error divided
  by ``U_kk`` times ``U_k,k+1:`` is the optimal update of the later rows.
- 4-bit: the scale and zero point of each block of ``block_size`` rows are chosen (asymmetric, MSE
  clip search) from the weights as updated when the block starts, so they cover the compensated
  values. int8 (``grid``): the scale is the plain one of the original weights, so the file stores
  what rounding to nearest would, only with better codes; compensated values beyond the grid clip
  at ``±qmax`` (never the lowest signed code: ONNX Runtime's kernels expect symmetric weights).
- Updates to rows outside the current chunk of rows are applied once per chunk (lazy batch
  update, the paper's §4 "Step 2"): the same result, with matrix products instead of row loops.
- GPTQ is greedy: a layer keeps whichever of GPTQ and rounding to nearest has the lower output
  error ``tr(DᵀHD)`` on the calibration inputs. int8 also asks GPTQ to generalise: its rows are
  split in two random halves, and GPTQ solved on one must beat rounding to nearest on the other.
  With fewer rows than ``K`` (a late, small feature map; a classifier on a few hundred images)
  ``H`` is singular and only the damping inverts it; on a network's features (few directions) GPTQ
  still generalises (the unseen CNNs' classifiers see 64 rows), on full-rank noise it would not,
  and the check catches it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from numpy.lib.stride_tricks import sliding_window_view

from modelpress.compress.quantize import pairs
from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    input_channel_axis,
    output_channel_axis,
)
from modelpress.compress.quantize.qparams import (
    QRANGE,
    PerChannel,
    PerGroup,
    PerTensor,
    QParams,
    dequantize,
    quantize,
    weight_qparams,
)
from modelpress.ir.match import const_array

DAMP = 0.01  # fraction of the mean diagonal added to H
CHUNK = 128  # rows per lazy-update chunk (a multiple of every power-of-two block size ≤ 128)
# int8: the largest reduction (C/g·kh·kw or K) solved; a wider layer is rounded to nearest. H
# grows as K² and its solves as K³: at 2304 (a 3x3 Conv over 256 channels) H holds 42 MB and the
# solves take a second, twice that reduction costs eight times more for no gain in accuracy. A
# layer may have seen fewer input rows than K (a late, small feature map): H is then singular and
# only the damping inverts it, which still beats rounding to nearest (checked by ``_codes``).
MAX_K = 2304
# Input rows per batch a layer adds to its H (drawn at random): each costs K² multiply-adds, so
# wide layers take fewer, down to MIN_ROWS.
MAX_ROWS, MIN_ROWS, ROW_BUDGET = 1024, 256, 2**31
# Rows per reduction row (rows / K) from which H is taken as well determined: no half-split check.
WELL_POSED = 4


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
    """Upper-triangular ``U`` with ``(H + λI)⁻¹ = UᵀU``, ``λ = damp · mean(diag H)``.

    With ``R`` the upper factor of ``H = RRᵀ`` (the Cholesky factor of ``H`` with its rows and
    columns reversed, reversed back), ``H⁻¹ = R⁻ᵀR⁻¹``: ``U = R⁻¹``, one factorisation and one
    inverse instead of inverting ``H`` and factorising the result."""
    h = np.array(h, dtype=np.float64)
    idx = np.arange(len(h))
    h[idx, idx] += damp * max(float(np.mean(np.diag(h))), 1e-12)
    r = np.linalg.cholesky(h[::-1, ::-1])[::-1, ::-1]
    return _upper_inverse(r)


def _upper_inverse(r: np.ndarray) -> np.ndarray:
    """``R⁻¹`` of an upper-triangular ``R``, by halves: ``[[A, B], [0, D]]⁻¹ = [[A⁻¹, −A⁻¹BD⁻¹],
    [0, D⁻¹]]``, matrix products instead of a general inverse (a third of its work)."""
    n = len(r)
    if n <= 256:
        return np.triu(np.linalg.inv(r))
    m = n // 2
    a, d = _upper_inverse(r[:m, :m]), _upper_inverse(r[m:, m:])
    out = np.zeros_like(r)
    out[:m, :m], out[m:, m:] = a, d
    out[:m, m:] = -(a @ r[:m, m:]) @ d
    return out


def gptq(
    w: np.ndarray,
    h: np.ndarray,
    *,
    block_size: int | None = None,
    dtype: str = "uint4",
    damp: float = DAMP,
    grid: QParams | None = None,
    paired: bool = False,
) -> tuple[np.ndarray, QParams]:
    """Integer codes and QParams for ``W [K, N]`` given ``H = XᵀX [K, K]``.

    Without ``grid``: blocks of ``block_size`` rows (``K`` a multiple of it), asymmetric ``dtype``,
    QParams ``axis=0``. With ``grid`` (symmetric, one scale per column ``axis=1``, or one for all):
    every row on that grid, which is returned. ``dequantize(codes, qp)`` is ``Ŵ``. ``paired``
    (with ``grid``): rows ``2i`` and ``2i+1`` keep ``|q[2i] + q[2i+1]| ≤ PAIR_LIMIT``; the second
    of a pair is clipped to it as it is rounded, and the error that leaves goes to the rows after,
    as any rounding error does.
    """
    k, n = w.shape
    if grid is None and (block_size is None or k % block_size):
        raise ValueError(f"reduction axis {k} is not a multiple of block size {block_size}")
    w = np.array(w, dtype=np.float64)
    h = np.array(h, dtype=np.float64)
    # a channel never active in calibration: decoupled, plainly rounded; its diagonal takes the
    # live channels' mean, so the damping (relative to the mean) does not depend on the scale
    dead = np.diag(h) == 0
    live = np.diag(h)[~dead]
    h[dead, dead] = float(live.mean()) if live.size else 1.0
    u = inverse_cholesky(h, damp)
    chunk = CHUNK if grid is not None else max(CHUNK - CHUNK % block_size, block_size)
    codes = np.zeros((k, n), dtype=np.int16)
    if grid is not None:
        qp_row = QParams(
            np.broadcast_to(grid.scale, (n,)),
            np.broadcast_to(grid.zero_point, (n,)),
            grid.dtype,
            axis=1,
        )
        qmax = QRANGE[grid.dtype][1]
    else:
        scales = np.zeros((k // block_size, n), np.float32)
        zero_points = np.zeros((k // block_size, n), np.int16)
    for c0 in range(0, k, chunk):
        c1 = min(c0 + chunk, k)
        wc = w[c0:c1]  # a view: updates land in w
        err = np.zeros_like(wc)
        for j in range(c1 - c0):
            row = c0 + j
            if grid is None and row % block_size == 0:
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
            if grid is not None:
                q = np.maximum(q, -qmax)
                if paired and row % 2:
                    prev = codes[row - 1].astype(np.int32)
                    lo = np.maximum(-qmax, -pairs.PAIR_LIMIT - prev)
                    hi = np.minimum(qmax, pairs.PAIR_LIMIT - prev)
                    q = np.clip(q, lo, hi).astype(q.dtype)
            codes[row] = q[0]
            e = (wc[j] - dequantize(q, qp_row)[0]) / u[row, row]
            wc[j + 1 :] -= np.outer(u[row, row + 1 : c1], e)
            err[j] = e
        w[c1:] -= u[c0:c1, c1:].T @ err
    container = quantize(np.zeros(1, np.float32), qp_row).dtype
    if grid is not None:
        return codes.astype(container), grid
    qp = QParams(scales, zero_points.astype(container), dtype, axis=0, block_size=block_size)
    return codes.astype(container), qp


def output_error(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> float:
    """``‖X(W − Ŵ)‖² / rows = tr((W − Ŵ)ᵀ H (W − Ŵ))`` for ``W [K, N]`` and ``H = XᵀX / rows``."""
    d = np.asarray(w_hat, np.float64) - w
    return float(np.sum((np.asarray(h, np.float64) @ d) * d))


class InputHessian:
    """``XᵀX`` of a layer's input rows for int8 GPTQ, per group, in two halves (each sample's rows
    go to one, alternately in a random order), for the check in ``_codes``. Rows: a 2-D Conv's
    input patches ``[C/g, kh, kw]`` (flattened like its weight), a MatMul/Gemm input's last axis;
    at most ``max_rows`` per batch (``ROW_BUDGET``), drawn at random (seeded)."""

    def __init__(self, node: ir.Node, seed: int = 0):
        w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
        self.conv = node.op_type == "Conv"
        a = node.attributes
        self.groups = a.get_int("group", 1) if self.conv else 1
        if self.conv:
            self.kernel = tuple(int(k) for k in w.shape[2:])
            self.strides = tuple(a.get_ints("strides", (1, 1)))
            self.dilations = tuple(a.get_ints("dilations", (1, 1)))
            self.pads = tuple(a.get_ints("pads", (0, 0, 0, 0)))
        self.rng = np.random.default_rng(seed)
        k = _reduction(node)
        self.xtx = np.zeros((2, self.groups, k, k), np.float32)
        self.max_rows = int(np.clip(ROW_BUDGET // (k * k), MIN_ROWS, MAX_ROWS))
        self.counts = [0, 0]  # rows in each half
        self.samples = 0

    @property
    def rows(self) -> int:
        return sum(self.counts)

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.ndim == 1:
            x = x[None]
        if self.conv:
            rows, sample = self._patches(x)
        else:  # [samples, ..., K]: every row of a sample (a sentence's tokens) goes to its half
            rows = x.reshape(-1, x.shape[-1])
            sample = np.arange(len(rows)) // max(int(np.prod(x.shape[1:-1])), 1)
            if len(rows) > self.max_rows:
                pick = self.rng.choice(len(rows), self.max_rows, replace=False)
                rows, sample = rows[pick], sample[pick]
        if not len(rows):
            return
        # halves by sample, not by row: neighbouring patches share most of their pixels, and a
        # check on rows from the same images would pass where GPTQ only fits them
        n = x.shape[0]
        half = ((self.samples + self.rng.permutation(n)) % 2)[sample]
        self.samples += n
        rows = rows.reshape(len(rows), self.groups, -1).astype(np.float32)
        for h in (0, 1):
            part = rows[half == h]
            self.counts[h] += len(part)
            for g in range(self.groups):
                self.xtx[h, g] += part[:, g].T @ part[:, g]

    def _patches(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Input patches ``[rows, C·kh·kw]`` (all of them, or ``max_rows`` at random, gathered
        from a strided view: the others are never copied) and the sample each comes from."""
        (kh, kw), (sh, sw), (dh, dw), p = self.kernel, self.strides, self.dilations, self.pads
        x = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
        n, c = x.shape[:2]
        oh = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
        ow = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
        if n == 0 or oh <= 0 or ow <= 0:
            return np.zeros((0, c * kh * kw), x.dtype), np.zeros(0, int)
        windows = sliding_window_view(x, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
        windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, oh, ow, kh, kw], a view
        total = n * oh * ow
        pick = (
            np.arange(total)
            if total <= self.max_rows
            else self.rng.choice(total, self.max_rows, False)
        )
        b, rest = np.divmod(pick, oh * ow)
        return windows[b, :, rest // ow, rest % ow].reshape(len(pick), -1), b

    def hessian(self, group: int, half: int | None = None) -> np.ndarray:
        """``XᵀX / rows`` of one group (float64), over one half of the rows or both."""
        if half is None:
            return (self.xtx[0, group].astype(np.float64) + self.xtx[1, group]) / max(self.rows, 1)
        return self.xtx[half, group].astype(np.float64) / max(self.counts[half], 1)


def observer(node: ir.Node) -> InputHessian | None:
    """The observer of the Hessian of ``node``'s input for int8 GPTQ, or None where it does not
    apply: a reduction of one row or over ``MAX_K``, a Conv that is not 2-D or pads by
    ``auto_pad``, a Gemm with ``transA``."""
    if node.op_type not in ("Conv", "Gemm", "MatMul"):
        return None
    w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
    if node.op_type == "Conv":
        if w.ndim != 4 or node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return None
    elif w.ndim != 2 or node.attributes.get_int("transA", 0):
        return None
    # one row (a 1x1 depthwise Conv: an affine) leaves nothing to compensate
    return InputHessian(node) if 2 <= _reduction(node) <= MAX_K else None


def attach(nodes: list[ir.Node], observers: dict[str, list]) -> dict[str, InputHessian]:
    """An ``InputHessian`` for each of ``nodes`` GPTQ applies to (``observer``), by node name,
    also added to ``observers`` under the node's input tensor (``calibration.collect``'s form)."""
    out = {}
    for node in nodes:
        h = observer(node)
        if h is not None:
            out[node.name] = h
            observers.setdefault(node.inputs[0].name, []).append(h)
    return out


def note(rounded: int, layers: int) -> str:
    return f"GPTQ: {rounded} of {layers} int8 weight(s) rounded on the calibration data"


def round_layers(
    nodes: list[ir.Node],
    observers: dict[str, InputHessian],
    *,
    per_channel: bool,
    dtype: str = "int8",
    pair_safe: bool = False,
    progress=None,
) -> dict[str, tuple[np.ndarray, QParams]]:
    """int8 codes and QParams (as ``weight_qparams`` would choose them: symmetric, per output
    channel or per tensor) of each node with an observer, by node name, where GPTQ moves the
    layer's output less than rounding to nearest (``_codes``). ``pair_safe``: on the scales of
    ``pairs``, with every pair of codes brought within its limit after solving."""
    out = {}
    todo = [n for n in nodes if n.name in observers and min(observers[n.name].counts)]
    for i, node in enumerate(todo):
        if progress:
            progress(i, len(todo))
        w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
        axis = output_channel_axis(node)
        if pair_safe and pairs.applies(node, w):
            qp = pairs.weight_qparams(node, w, per_channel=per_channel)
        else:
            qp = weight_qparams(
                w, PerChannel(axis) if per_channel else PerTensor(), dtype=dtype, symmetric=True
            )
        # filters as rows: Conv [O, C/g·kh·kw]; Gemm transB stores [N, K]; MatMul/Gemm [K, N]
        flat = w.reshape(w.shape[0], -1) if input_channel_axis(node) == 1 else w.T
        paired = pair_safe and pairs.applies(node, w)
        order = _kernel_order(w) if paired and node.op_type == "Conv" else None
        try:
            codes = _codes(flat.astype(np.float64), observers[node.name], qp, order, paired)
        except np.linalg.LinAlgError:
            continue
        if codes is not None:
            codes = codes.reshape(w.shape) if input_channel_axis(node) == 1 else codes.T
            out[node.name] = (pairs.limit(node, codes) if pair_safe else codes, qp)
    if progress and todo:
        progress(len(todo), len(todo))
    return out


def _reduction(node: ir.Node) -> int:
    w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
    return (
        int(np.prod(w.shape[1:])) if node.op_type == "Conv" else w.shape[input_channel_axis(node)]
    )


def _column_grid(qp: QParams, rows: slice) -> QParams:
    """``qp`` (per output channel, or per tensor) as the grid of the columns of ``W [K, N]``."""
    if np.ndim(qp.scale) == 0:
        return QParams(qp.scale, qp.zero_point, qp.dtype)
    return QParams(np.asarray(qp.scale)[rows], np.asarray(qp.zero_point)[rows], qp.dtype, axis=1)


def _kernel_order(w: np.ndarray) -> np.ndarray:
    """The positions of a Conv filter's ``(C/g, kh, kw)`` flattening in the ``(kh, kw, C/g)``
    order the int8 kernel reads, whose neighbours it pairs (``pairs``)."""
    return (
        np.arange(int(np.prod(w.shape[1:])))
        .reshape(w.shape[1:])
        .transpose(*range(1, w.ndim - 1), 0)
        .reshape(-1)
    )


def _codes(
    flat: np.ndarray,
    obs: InputHessian,
    qp: QParams,
    order: np.ndarray | None = None,
    paired: bool = False,
) -> np.ndarray | None:
    """Codes of the filters ``flat [O, K]`` (``O/g`` per group), or None when no group gains.

    A group uses GPTQ (solved on all rows) where it moves the output less than rounding to nearest
    on the calibration rows. With fewer than ``WELL_POSED`` rows per row of ``K`` it may fit them
    rather than the layer (a singular ``H``): GPTQ solved on one half of the samples must then also
    beat rounding to nearest on the other half; otherwise the group keeps RTN codes."""
    per = flat.shape[0] // obs.groups
    qmax = QRANGE[qp.dtype][1]
    checked = obs.rows < WELL_POSED * flat.shape[1]
    out = []
    gain = False
    order = np.arange(flat.shape[1]) if order is None else order
    back = np.argsort(order)
    for g in range(obs.groups):
        rows = slice(g * per, (g + 1) * per)
        wk, grid = flat[rows].T[order], _column_grid(qp, rows)
        rtn = np.maximum(quantize(wk, grid), -qmax)
        best = rtn
        h = obs.hessian(g)[np.ix_(order, order)]
        if np.isfinite(h).all() and (
            not checked or _generalises(wk, rtn, grid, obs, g, order, paired)
        ):
            codes, _ = gptq(wk, h, grid=grid, paired=paired)
            if _error(wk, codes, grid, h) < _error(wk, rtn, grid, h):
                best, gain = codes, True
        out.append(best[back].T)
    return np.concatenate(out) if gain else None


def _generalises(wk, rtn, grid: QParams, obs: InputHessian, group: int, order, paired) -> bool:
    """Whether GPTQ solved on half 0 of the samples beats ``rtn`` on half 1."""
    h_fit = obs.hessian(group, 0)[np.ix_(order, order)]
    h_check = obs.hessian(group, 1)[np.ix_(order, order)]
    trial, _ = gptq(wk, h_fit, grid=grid, paired=paired)
    return _error(wk, trial, grid, h_check) < _error(wk, rtn, grid, h_check)


def _error(wk: np.ndarray, codes: np.ndarray, grid: QParams, h: np.ndarray) -> float:
    return output_error(wk, dequantize(codes, grid), h)
