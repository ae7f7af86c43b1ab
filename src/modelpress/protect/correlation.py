"""Pearson correlation between tensors, the measure every protection check uses.

Tensors are compared flattened: each becomes a row of zero mean and unit norm (``standardized``),
so the |dot product| of two rows is their |Pearson r|. A constant tensor (or one with NaN or inf)
becomes a zero row: it has no correlation with anything, and is left out of the maxima.

``views`` gives the layouts of a tensor that a reader could line up with another by reshaping or
transposing it (every axis order of a tensor of rank 4 or less, the reversed order above that);
``max_correlation`` compares every view of each original tensor with every stored tensor of the
same size.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def standardized(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays as rows of zero mean and unit norm (a constant array gives a zero row)."""
    out = np.empty((len(arrays), arrays[0].size if arrays else 0), dtype=np.float64)
    for row, a in zip(out, arrays):
        row[:] = a.reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf: a zero row, below
            row -= row.mean()
            norm = math.sqrt(float(row @ row))
        if norm > 0 and math.isfinite(norm):
            row /= norm
        else:
            row[:] = 0.0
    return out


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """|Pearson correlation| of two same-size tensors (0 when either is constant)."""
    x = standardized([a, b])
    return float(abs(x[0] @ x[1]))


def views(array: np.ndarray) -> list[np.ndarray]:
    """``array`` in every axis order (rank <= 4; the reversed order only above), each one a
    different flattening of the same values."""
    if array.ndim <= 1:
        return [array]
    if array.ndim > 4:
        return [array, array.transpose()]
    return [array.transpose(order) for order in itertools.permutations(range(array.ndim))]


_CHUNK_BYTES = 32 << 20  # float64 working set of one column chunk, all rows of a size together


def _flat(array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of ``array`` flattened in its own (C) order, as float64."""
    if array.flags.c_contiguous:
        return array.reshape(-1)[start:stop].astype(np.float64)
    return np.asarray(array.flat[start:stop], dtype=np.float64)


def _pairs(stored: list[np.ndarray], original: list[np.ndarray]) -> np.ndarray:
    """|Pearson r| of every (stored, original) pair of same-size tensors, rows with no
    correlation (constant, NaN or inf) dropped: one pass over the tensors in column chunks, so
    the working set stays at ``_CHUNK_BYTES`` whatever their size (``standardized`` rows of
    them all would take twice their size in float64)."""
    arrays = [*stored, *original]
    with np.errstate(invalid="ignore", over="ignore"):
        means = np.array([np.mean(a, dtype=np.float64) for a in arrays])
    size = arrays[0].size
    step = max(1, _CHUNK_BYTES // (8 * len(arrays)))
    dots = np.zeros((len(stored), len(original)))
    squares = np.zeros(len(arrays))
    block = np.empty((len(arrays), min(step, size)))
    finite = np.isfinite(means)
    for start in range(0, size, step):
        stop = min(start + step, size)
        rows = block[:, : stop - start]
        for i, a in enumerate(arrays):
            rows[i] = _flat(a, start, stop) - means[i] if finite[i] else 0.0
        with np.errstate(invalid="ignore", over="ignore"):
            squares += np.einsum("ij,ij->i", rows, rows)
            dots += rows[: len(stored)] @ rows[len(stored) :].T
    norms = np.sqrt(squares)
    good = finite & (norms > 0) & np.isfinite(norms)
    s, o = good[: len(stored)], good[len(stored) :]
    with np.errstate(invalid="ignore", divide="ignore"):
        r = dots / norms[: len(stored), None] / norms[None, len(stored) :]
    return np.abs(r[s][:, o])


def max_correlation(
    stored: list[np.ndarray], original: list[np.ndarray], *, transposed: bool = False
) -> tuple[float, int]:
    """The largest |Pearson correlation| over same-size (stored, original) pairs, and the number
    of pairs compared; with ``transposed``, every ``views`` of each original counts as a pair."""
    worst, pairs = 0.0, 0
    sizes = {a.size for a in stored} & {a.size for a in original}
    for size in sorted(sizes):
        same = [a for a in original if a.size == size]
        c = _pairs(
            [a for a in stored if a.size == size],
            [v for a in same for v in (views(a) if transposed else [a])],
        )
        if not c.size:
            continue
        pairs += c.size
        worst = max(worst, float(c.max()))
    return worst, pairs
