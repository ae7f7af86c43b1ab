"""The batched KV cache: one row a running sequence, rows joining and leaving between steps.

Each layer's keys and values are numpy arrays ``[rows, kv_heads, columns, head_dim]`` and
``mask`` (``[rows, columns]``, int64) says which columns of a row hold real entries. ``lengths``
counts each row's real entries, which is also the position of its next token.

The two layouts of ``ir.llm``:

- ``append``: a step writes every row's new entry in a new last column, so a row's real entries
  may sit anywhere and the mask marks them. A joining row is padded with hole columns on the
  left (or the batch is, when the new row is longer); columns that are holes in every row are
  dropped when a row leaves.
- ``left_aligned``: row ``b``'s ``lengths[b]`` real entries are its first columns and a step
  writes at ``lengths[b]``; the mask is ones then zeros. Joining pads on the right; leaving drops
  the columns past the longest row.

Holes hold zeros: a masked score gets no weight, and zero values keep ``0 * value`` finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelpress.ir.llm import KV_LAYOUTS

KV_DTYPES = {"float32": np.float32, "float16": np.float16}


@dataclass
class KVCache:
    layout: str
    keys: list[np.ndarray]
    values: list[np.ndarray]
    mask: np.ndarray  # [rows, columns] int64
    lengths: np.ndarray  # [rows] int64: real entries of each row

    @classmethod
    def empty(
        cls, *, layers: int, kv_heads: int, head_dim: int, dtype: str, layout: str, rows: int = 0
    ) -> KVCache:
        assert layout in KV_LAYOUTS, layout
        shape = (rows, kv_heads, 0, head_dim)
        np_dtype = KV_DTYPES[dtype]
        return cls(
            layout=layout,
            keys=[np.zeros(shape, np_dtype) for _ in range(layers)],
            values=[np.zeros(shape, np_dtype) for _ in range(layers)],
            mask=np.zeros((rows, 0), np.int64),
            lengths=np.zeros(rows, np.int64),
        )

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    # -- a step -------------------------------------------------------------------------------

    def step_inputs(self, new: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``attention_mask`` and ``position_ids`` for a step that feeds ``new`` tokens a row."""
        positions = self.lengths[:, None] + np.arange(new, dtype=np.int64)[None, :]
        if self.layout == "append":
            mask = np.concatenate([self.mask, np.ones((self.rows, new), np.int64)], axis=1)
        else:
            columns = np.arange(self.columns + new, dtype=np.int64)[None, :]
            mask = (columns < (self.lengths + new)[:, None]).astype(np.int64)
        return mask, positions

    def advance(
        self, keys: list[np.ndarray], values: list[np.ndarray], mask: np.ndarray, new: int = 1
    ) -> None:
        """Take a step's ``present`` arrays as the cache; ``mask``: the step's attention mask."""
        self.keys, self.values = list(keys), list(values)
        self.lengths = self.lengths + new
        columns = keys[0].shape[2] if keys else mask.shape[1]
        if self.layout == "append":
            self.mask = mask
        else:
            self.mask = (np.arange(columns)[None, :] < self.lengths[:, None]).astype(np.int64)
        assert self.mask.shape[1] == columns, (self.mask.shape, columns)

    # -- joining and leaving --------------------------------------------------------------------

    def join(self, other: KVCache) -> None:
        """Append the rows of ``other`` (e.g. a prefilled prompt) after this cache's rows."""
        assert other.layout == self.layout
        width = max(self.columns, other.columns)
        mine, theirs = self._padded(width), other._padded(width)
        self.keys = [np.concatenate([a, b], axis=0) for a, b in zip(mine[0], theirs[0])]
        self.values = [np.concatenate([a, b], axis=0) for a, b in zip(mine[1], theirs[1])]
        self.mask = np.concatenate([mine[2], theirs[2]], axis=0)
        self.lengths = np.concatenate([self.lengths, other.lengths])

    def _padded(self, width: int):
        extra = width - self.columns
        if extra == 0:
            return self.keys, self.values, self.mask
        left = self.layout == "append"  # append: holes on the left; left_aligned: on the right
        pad = ((0, 0), (0, 0), (extra, 0) if left else (0, extra), (0, 0))
        keys = [np.pad(a, pad) for a in self.keys]
        values = [np.pad(a, pad) for a in self.values]
        mask = np.pad(self.mask, ((0, 0), (extra, 0) if left else (0, extra)))
        return keys, values, mask

    def take(self, rows) -> KVCache:
        """A new cache of ``rows`` (copied), with all the columns."""
        rows = np.asarray(rows, dtype=np.int64)
        return KVCache(
            self.layout,
            [a[rows] for a in self.keys],
            [a[rows] for a in self.values],
            self.mask[rows],
            self.lengths[rows],
        )

    def leave(self, rows: list[int]) -> None:
        """Drop ``rows`` and then the columns that are holes in every row left."""
        if not rows:
            return
        keep = np.setdiff1d(np.arange(self.rows), np.asarray(rows, dtype=np.int64))
        used = self.mask[keep].any(axis=0) if len(keep) else np.zeros(self.columns, bool)
        if self.layout == "left_aligned":
            width = int(self.lengths[keep].max()) if len(keep) else 0
            cols = np.arange(width)
        else:
            cols = np.flatnonzero(used)
        if len(cols) == self.columns:
            cols = slice(None)
        elif self.layout == "left_aligned" or (len(cols) and cols[-1] - cols[0] + 1 == len(cols)):
            cols = slice(int(cols[0]), int(cols[-1]) + 1) if len(cols) else slice(0, 0)

        def take(a):
            return np.ascontiguousarray(a[keep][:, :, cols])

        self.keys = [take(a) for a in self.keys]
        self.values = [take(a) for a in self.values]
        self.mask = np.ascontiguousarray(self.mask[keep][:, cols])
        self.lengths = self.lengths[keep]
