"""Where the batch's KV cache lives: two buffers per cache array, written in turn.

A decode step reads the cache (``past``) and writes a new one, one column longer (``present``),
so both exist while the step runs. ``KVStore`` keeps, for each of the cache's arrays (a layer's
keys or values), two flat buffers: the cache is a view of the first ``rows * kv_heads * columns
* head_dim`` elements of one of them (its ``active`` side), and the step's ``present`` is bound
(ONNX Runtime's IO binding) to the same prefix of the other (``spare``), which then becomes the
active side. Joining and leaving write their result into the spare side the same way. Nothing
is allocated per step and nothing is concatenated: the resident cache is twice the largest cache
the batch has needed, where ONNX Runtime's outputs and numpy's copies used to leave about two and
a half times that behind in the heap, never given back.

The buffers are private anonymous memory maps: a page becomes resident when first written, so a
buffer may be reserved larger than it is used, and when the batch shrinks the pages past what the
next step needs go back to the system (``madvise(MADV_DONTNEED)``); an empty batch drops them all.

``SharedKVStore`` (share mode, the left-aligned caches: ONNX Runtime's GroupQueryAttention, or
the standard level's ScatterND):
a side's buffers are laid out ``[rows, kv_heads, capacity, head_dim]`` (``full``), the cache's
arrays are their first ``columns`` columns, and a decode step binds the active side's buffers as
both its past and its present: GroupQueryAttention sees the same pointers and writes only the new
entries, in place (its ``past_present_share_buffer`` mode). The two sides are used only when the
layout changes: a join, a leave, or a capacity that is too small (then doubled).
"""

from __future__ import annotations

import mmap
import operator

import numpy as np

_PAGE = mmap.PAGESIZE
_MIN_BYTES = 1 << 20  # the smallest buffer reserved (address space, not resident memory)
_PRIVATE = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
    else None
)


class _Buffer:
    """One flat buffer: a private anonymous map and a numpy array over it."""

    def __init__(self, elements: int, dtype: np.dtype) -> None:
        nbytes = max(_MIN_BYTES, elements * dtype.itemsize)
        nbytes = -(-nbytes // _PAGE) * _PAGE
        if _PRIVATE is None:  # no private anonymous maps (Windows): plain memory, kept
            self.map = None
            self.array = np.zeros(nbytes // dtype.itemsize, dtype)
        else:
            self.map = mmap.mmap(-1, nbytes, flags=_PRIVATE)
            self.array = np.frombuffer(self.map, dtype)
        self.nbytes = nbytes

    def release_from(self, nbytes: int) -> None:
        """Give the pages from ``nbytes`` on back to the system (they read as zeros after)."""
        start = -(-nbytes // _PAGE) * _PAGE
        if start < self.nbytes and self.map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self.map.madvise(mmap.MADV_DONTNEED, start, self.nbytes - start)


class KVStore:
    """Two buffers for each of ``arrays`` cache arrays of ``dtype``."""

    def __init__(self, arrays: int, dtype) -> None:
        self.arrays = arrays
        self.dtype = np.dtype(dtype)
        self._sides: list[list[_Buffer | None]] = [[None] * arrays, [None] * arrays]
        self._spare = 0

    def spare(self, shape: tuple[int, ...]) -> list[np.ndarray]:
        """Arrays of ``shape`` over the spare side (contents undefined), one per cache array."""
        elements = int(np.prod(shape))
        if elements == 0:
            return [np.zeros(shape, self.dtype) for _ in range(self.arrays)]
        side = self._sides[self._spare]
        out = []
        for i, buffer in enumerate(side):
            if buffer is None or buffer.array.size < elements:
                # twice what is asked: address space only, and a growing batch reallocates less
                side[i] = buffer = _Buffer(2 * elements, self.dtype)
            out.append(buffer.array[:elements].reshape(shape))
        return out

    def holds(self, arrays: list[np.ndarray]) -> bool:
        """Whether ``arrays`` are the spare side's (a step that wrote its present there)."""
        side = self._sides[self._spare]
        return len(arrays) == self.arrays and all(
            b is not None and np.may_share_memory(a, b.array) for a, b in zip(arrays, side)
        )

    def written_in_place(self, arrays: list[np.ndarray]) -> bool:
        """Whether ``arrays`` are the active side's, written in place by a step (share mode)."""
        return False

    def flip(self) -> None:
        """The spare side, just written, holds the cache now."""
        self._spare = 1 - self._spare

    def trim(self, elements: int) -> None:
        """Give back the pages past the first ``elements`` of every buffer (a smaller batch)."""
        if elements == 0:
            self._sides = [[None] * self.arrays, [None] * self.arrays]
            return
        for side in self._sides:
            for buffer in side:
                if buffer is not None:
                    buffer.release_from(elements * self.dtype.itemsize)

    def reserved_bytes(self) -> int:
        return sum(b.nbytes for side in self._sides for b in side if b is not None)


ALIGN = 16  # an ``in_place`` step's width is a multiple of this (``aligned``)


def aligned(written: int) -> int:
    """The width an ``in_place`` step runs over when it leaves ``written`` columns: at least one
    masked column more, rounded up to ``ALIGN`` (a 16-float vector, two 8-float ones). ONNX
    Runtime's Attention then sums a row the same way batched and alone: the row's entries fill
    the same vectors from column 0, and the widths differ by whole vectors of masked columns,
    which add exact zeros. Measured on this project's AVX-512 machines: a row that fills a width
    of 4k+3 to its last column sums otherwise than one with a masked column after it, and any
    width with one gives the same bits; widths of 64 cost 7% of a SmolLM2 int4 decode step
    against 1.5% for 16. The tests check the bits on each machine they run on."""
    return -(-(written + 1) // ALIGN) * ALIGN


class SharedKVStore(KVStore):
    """A ``KVStore`` whose sides are ``[rows, kv_heads, capacity, head_dim]`` buffers, written in
    place by the steps; ``limit``: the largest capacity (the model's context). ``bounded``: the
    steps read the whole buffers (the ``in_place`` layout's Attention runs over every column,
    masked or not), so room costs time: a layout gets at most twice its columns, and grows by
    doubling when a step needs more, instead of the whole ``reserve`` at once (which suits
    GroupQueryAttention, which reads each row's own length only), and its capacity is
    ``aligned``: at least ``margin`` (one) column past what a step writes, a multiple of
    ``ALIGN`` (short of ``limit``)."""

    def __init__(self, arrays: int, dtype, *, limit: int, bounded: bool = False) -> None:
        super().__init__(arrays, dtype)
        self.limit = limit
        self.bounded = bounded
        self.margin = 1 if bounded else 0
        self.reserve = 0  # the columns the running rows will need (``Engine``)
        self._full: list[list[np.ndarray] | None] = [None, None]

    def spare(self, shape: tuple[int, ...]) -> list[np.ndarray]:
        """The spare side laid out for ``shape``'s rows with room for ``reserve`` columns (at
        least one more than ``shape``'s, within ``limit``): views of its first columns."""
        rows, heads, columns, dim = shape
        room = max(self.reserve, columns + 1)
        if self.bounded:
            room = aligned(max(min(room, 2 * columns), columns + 1))
        capacity = max(columns, min(self.limit, room))
        full = super().spare((rows, heads, capacity, dim))
        self._full[self._spare] = full
        return [a[:, :, :columns] for a in full]

    def full(self) -> list[np.ndarray] | None:
        """The active side's whole buffers (None before the first layout)."""
        return self._full[1 - self._spare]

    def capacity(self) -> int:
        full = self.full()
        return int(full[0].shape[2]) if full else 0

    def written_in_place(self, arrays: list[np.ndarray]) -> bool:
        full = self.full()
        return (
            full is not None and len(arrays) == len(full) and all(map(operator.is_, arrays, full))
        )

    def trim(self, elements: int) -> None:
        full = self.full()
        if elements and full:  # the rows' columns past ``elements`` are still in the layout
            elements = max(elements, full[0].size)
        if elements == 0:
            self._full = [None, None]
        super().trim(elements)
