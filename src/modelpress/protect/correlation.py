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


_CHUNK_BYTES = 8 << 20  # float64 working set of one column chunk


def _flat(array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of ``array`` flattened in its own (C) order, as float64."""
    if array.flags.c_contiguous:
        return array.reshape(-1)[start:stop].astype(np.float64)
    return np.asarray(array.flat[start:stop], dtype=np.float64)


def _array(item) -> np.ndarray:
    return item if isinstance(item, np.ndarray) else np.asarray(item.numpy())


class Targets:
    """Same-size tensors as the rows of ``standardized(arrays)``, without holding those rows:
    ``X @ v`` is computed in column chunks (its working set ``_CHUNK_BYTES``), ``X * v`` and
    ``dense()`` build the rows (for small tensors, or the rare case that needs them)."""

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.size = _array(arrays[0]).size if arrays else 0
        with np.errstate(invalid="ignore", over="ignore"):
            self.means = np.array([np.mean(_array(a), dtype=np.float64) for a in arrays])
        squares = np.zeros(len(arrays))
        for _, _, rows in self._chunks():
            with np.errstate(invalid="ignore", over="ignore"):
                squares += np.einsum("ij,ij->i", rows, rows)
        norms = np.sqrt(squares)
        self.good = np.isfinite(self.means) & (norms > 0) & np.isfinite(norms)
        self.norms = np.where(self.good, norms, 1.0)

    def __len__(self) -> int:
        return len(self.arrays)

    def _chunks(self):
        step = max(1, _CHUNK_BYTES // (8 * max(len(self.arrays), 1)))
        block = np.empty((len(self.arrays), min(step, self.size)))
        finite = np.isfinite(self.means)
        for start in range(0, self.size, step):
            stop = min(start + step, self.size)
            rows = block[:, : stop - start]
            for i, a in enumerate(self.arrays):
                rows[i] = _flat(_array(a), start, stop) - self.means[i] if finite[i] else 0.0
            yield start, stop, rows

    def dot(self, v: np.ndarray, shift: float = 0.0) -> np.ndarray:
        """``X @ (v - shift)``, ``v`` read in chunks (never converted whole)."""
        out = np.zeros(len(self.arrays))
        flat = v.reshape(-1)
        for start, stop, rows in self._chunks():
            with np.errstate(invalid="ignore", over="ignore"):
                out += rows @ (flat[start:stop].astype(np.float64) - shift)
        return np.where(self.good, out / self.norms, 0.0)

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        return self.dot(v)

    def dense(self) -> np.ndarray:
        return standardized([_array(a) for a in self.arrays])

    def __mul__(self, v: np.ndarray) -> np.ndarray:
        return self.dense() * v


def _squares(flat: np.ndarray, mean: float) -> float:
    """``sum((flat - mean)**2)`` in float64, in chunks."""
    step = _CHUNK_BYTES // 8
    total = 0.0
    for start in range(0, flat.size, step):
        c = flat[start : start + step].astype(np.float64) - mean
        total += float(c @ c)
    return total


def _pairs(stored: list, original: list) -> np.ndarray:
    """|Pearson r| of every (stored, original) pair of same-size tensors (arrays, or tensors read
    when needed), rows with no correlation (constant, NaN or inf) dropped. The stored tensors are
    taken one at a time against the originals in column chunks, so that neither side is ever
    held as float64 rows (``standardized`` rows of them all would take twice their size)."""
    targets = Targets(original)
    r = np.zeros((len(stored), len(original)))
    kept = np.zeros(len(stored), dtype=bool)
    for i, item in enumerate(stored):
        a = _array(item).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            mean = float(np.mean(a, dtype=np.float64))
            norm = math.sqrt(_squares(a, mean)) if math.isfinite(mean) else 0.0
        if norm > 0 and math.isfinite(norm):
            kept[i] = True
            r[i] = np.abs(targets.dot(a, mean)) / norm
        del a
    return r[kept][:, targets.good]


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
            [v for a in same for v in (views(_array(a)) if transposed else [a])],
        )
        if not c.size:
            continue
        pairs += c.size
        worst = max(worst, float(c.max()))
    return worst, pairs
