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


def _rows(arrays: list[np.ndarray]) -> np.ndarray:
    x = standardized(arrays)
    return x[np.abs(x).sum(axis=1) > 0]


def max_correlation(
    stored: list[np.ndarray], original: list[np.ndarray], *, transposed: bool = False
) -> tuple[float, int]:
    """The largest |Pearson correlation| over same-size (stored, original) pairs, and the number
    of pairs compared; with ``transposed``, every ``views`` of each original counts as a pair."""
    worst, pairs = 0.0, 0
    sizes = {a.size for a in stored} & {a.size for a in original}
    for size in sorted(sizes):
        s = _rows([a for a in stored if a.size == size])
        same = [a for a in original if a.size == size]
        o = _rows([v for a in same for v in (views(a) if transposed else [a])])
        if not len(s) or not len(o):
            continue
        c = np.abs(s @ o.T)
        pairs += c.size
        worst = max(worst, float(c.max()))
    return worst, pairs
