"""The batched KV cache: one row a running sequence, rows joining and leaving between steps.

Each layer's keys and values are numpy arrays ``[rows, kv_heads, columns, head_dim]`` and
``mask`` (``[rows, columns]``, int64) says which columns of a row hold real entries. ``lengths``
counts each row's real entries, which is also the position of its next token.

The layouts of ``ir.llm``, two here (``in_place`` is ``left_aligned`` to the cache: the step's
room is the decoder's business, ``decoder.py``):

- ``append``: a step writes every row's new entry in a new last column, so a row's real entries
  may sit anywhere and the mask marks them. A joining row is padded with hole columns on the
  left (or the batch is, when the new row is longer); columns that are holes in every row are
  dropped when a row leaves.
- ``left_aligned``: row ``b``'s ``lengths[b]`` real entries are its first columns and a step
  writes at ``lengths[b]``; the mask is ones then zeros. Joining pads on the right; leaving drops
  the columns past the longest row.

Holes hold zeros: a masked score gets no weight, and zero values keep ``0 * value`` finite.

The batch's cache has a ``store`` (``kv_store.KVStore``): a step's present, a join's and a
leave's result are written into its spare buffers (``spare``), never concatenated anew. A cache
without one (a prompt being prefilled, the groups of ``Engine._groups``) takes the arrays it is
given. With ``shared`` (a left-aligned cache, ``kv_store.SharedKVStore``) the arrays are the
first columns of buffers with room for more: ``in_place`` hands a step those whole buffers, to
be bound as its past and its present, and the step's new entries are written there in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelpress.ir.llm import KV_LAYOUTS, LEFT_ALIGNED, DecoderConfig
from modelpress.runtime.generate.kv_store import KVStore, SharedKVStore

KV_DTYPES = {"float32": np.float32, "float16": np.float16}


class _Columns(Sequence):
    """The first ``width`` columns of each of ``buffers`` (share mode), sliced when read: a step
    that wrote in place moves ``width`` on without making a view of each of the cache's arrays
    (sixty for a 30-layer model: a tenth of the engine's own time a step)."""

    __slots__ = ("buffers", "width")

    def __init__(self, buffers: list[np.ndarray], width: int) -> None:
        self.buffers, self.width = buffers, width

    def __len__(self) -> int:
        return len(self.buffers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [a[:, :, : self.width] for a in self.buffers[i]]
        return self.buffers[i][:, :, : self.width]

    def __add__(self, other) -> list[np.ndarray]:
        return list(self) + list(other)

    def __radd__(self, other) -> list[np.ndarray]:
        return list(other) + list(self)


@dataclass
class KVCache:
    layout: str
    keys: list[np.ndarray]
    values: list[np.ndarray]
    mask: np.ndarray  # [rows, columns] int64
    lengths: np.ndarray  # [rows] int64: real entries of each row
    store: KVStore | None = None

    @classmethod
    def empty(
        cls, config: DecoderConfig, *, rows: int = 0, stored: bool = False, shared: bool = False
    ) -> KVCache:
        """An empty cache of ``rows`` for the decoder of ``config``; ``stored``: in a ``KVStore``
        (the running batch's cache); ``shared``: in a ``SharedKVStore`` (steps write in place;
        left-aligned layouts only)."""
        assert config.kv_layout in KV_LAYOUTS, config.kv_layout
        shape = (rows, config.num_kv_heads, 0, config.head_dim)
        dtype = KV_DTYPES[config.kv_dtype]
        layers = config.num_layers
        if shared:
            assert config.kv_layout in LEFT_ALIGNED, config.kv_layout
            store = SharedKVStore(
                2 * layers,
                dtype,
                limit=config.max_context,
                bounded=config.kv_layout == "in_place",  # its steps read every column
            )
        else:
            store = KVStore(2 * layers, dtype) if stored else None
        return cls(
            layout=config.kv_layout,
            keys=[np.zeros(shape, dtype) for _ in range(layers)],
            values=[np.zeros(shape, dtype) for _ in range(layers)],
            mask=np.zeros((rows, 0), np.int64),
            lengths=np.zeros(rows, np.int64),
            store=store,
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
        """``attention_mask`` and ``position_ids`` for a step that feeds ``new`` tokens a row
        (read only: one token's positions are a view of ``lengths``, which is replaced, never
        changed in place)."""
        if new == 1:
            positions = self.lengths[:, None]
        else:
            positions = self.lengths[:, None] + np.arange(new, dtype=np.int64)[None, :]
        if self.layout == "append":
            mask = np.concatenate([self.mask, np.ones((self.rows, new), np.int64)], axis=1)
        elif self.rows and int(self.lengths.min()) == self.columns:  # no holes: all ones
            mask = np.ones((self.rows, self.columns + new), np.int64)
        else:
            columns = np.arange(self.columns + new, dtype=np.int64)[None, :]
            mask = (columns < (self.lengths + new)[:, None]).astype(np.int64)
        return mask, positions

    def spare(self, new: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """Where a step that feeds ``new`` tokens a row may write its present keys and values
        (None without a store, and with a shared one: its steps write ``in_place``)."""
        if self.store is None or isinstance(self.store, SharedKVStore):
            return None
        return self._target(self.rows, self.columns + new)

    def reserve(self, columns: int) -> None:
        """The columns the rows will need (prompt plus the tokens to generate): a shared store
        lays its buffers out with that room at the next join or leave."""
        if isinstance(self.store, SharedKVStore):
            self.store.reserve = columns

    def in_place(self, new: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The whole buffers a step that feeds ``new`` tokens a row writes into in place, bound
        as both its past and its present (a shared store; None otherwise, or past ``limit``).
        Too small, they are laid out again with twice the room first (one copy)."""
        store = self.store
        if not isinstance(store, SharedKVStore) or not self.keys or self.rows == 0:
            return None
        columns = self.columns + new
        full = store.full()
        if (
            full is None
            or full[0].shape[2] < columns + store.margin
            or not np.may_share_memory(self.keys[0], full[0])  # (each array its own buffer)
        ):
            if columns + store.margin > store.limit:
                return None
            store.reserve = max(store.reserve, min(store.limit, 2 * store.capacity()), columns)
            self._adopt(self.keys, self.values)  # copied into the spare side, laid out anew
        full = store.full()
        if int(self.lengths.min()) < self.columns:
            # the columns this step adds are holes in the shorter rows: zeros, as everywhere
            # (the spare side's layout held other rows' entries there; GroupQueryAttention does
            # not read past a row's length, a copy of the rows might)
            for a in full:
                a[:, :, self.columns : columns] = 0
        layers = len(self.keys)
        return full[:layers], full[layers:]

    def _target(self, rows: int, columns: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Arrays for a cache of ``rows`` x ``columns``: the store's spare side, or new ones."""
        layers = len(self.keys)
        shape = (rows, self.keys[0].shape[1], columns, self.keys[0].shape[3]) if layers else ()
        if self.store is None:
            arrays = [np.empty(shape, self.keys[0].dtype) for _ in range(2 * layers)]
        else:
            arrays = self.store.spare(shape)
        return arrays[:layers], arrays[layers:]

    def _adopt(self, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Make ``keys`` and ``values`` the cache: in the store they are copied to its spare side
        first unless they are there already (a decoder that wrote its present where asked)."""
        keys, values = list(keys), list(values)
        store = self.store
        if store is not None and keys and not store.holds(keys + values):
            rows, _, columns, _ = keys[0].shape
            mine_k, mine_v = self._target(rows, columns)
            for out, a in zip(mine_k + mine_v, keys + values):
                out[...] = a
            keys, values = mine_k, mine_v
        if store is not None and keys:
            store.flip()
        self.keys, self.values = keys, values

    def advance(
        self, keys: list[np.ndarray], values: list[np.ndarray], mask: np.ndarray, new: int = 1
    ) -> None:
        """Take a step's ``present`` arrays as the cache; ``mask``: the step's attention mask."""
        if self.store is not None and self.store.written_in_place(list(keys) + list(values)):
            width = mask.shape[1]  # the buffers of ``in_place``: the cache is their first columns
            self.keys, self.values = _Columns(keys, width), _Columns(values, width)
            columns = width
        else:
            self._adopt(keys, values)
            columns = self.keys[0].shape[2] if self.keys else mask.shape[1]
        self.lengths = self.lengths + new
        # left_aligned: the step's mask (ones up to each row's length plus ``new``) is the new one
        if self.layout in LEFT_ALIGNED and mask.shape[1] != columns:
            self.mask = (np.arange(columns)[None, :] < self.lengths[:, None]).astype(np.int64)
        else:
            self.mask = mask
        assert self.mask.shape[1] == columns, (self.mask.shape, columns)

    # -- joining and leaving --------------------------------------------------------------------

    def join(self, other: KVCache) -> None:
        """Append the rows of ``other`` (e.g. a prefilled prompt) after this cache's rows."""
        assert other.layout == self.layout
        width = max(self.columns, other.columns)
        keys, values = self._target(self.rows + other.rows, width)
        for out, mine, theirs in zip(
            keys + values, self.keys + self.values, other.keys + other.values
        ):
            self._place(out[: self.rows], mine)
            self._place(out[self.rows :], theirs)
        self.mask = np.concatenate(
            [self._padded(self.mask, width), other._padded(other.mask, width)]
        )
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self._adopt(keys, values)

    def _place(self, out: np.ndarray, a: np.ndarray) -> None:
        """``a`` into the wider ``out``, the holes zeros: on the left (``append``) or on the
        right (``left_aligned``)."""
        extra = out.shape[2] - a.shape[2]
        real = slice(extra, None) if self.layout == "append" else slice(0, a.shape[2])
        holes = slice(0, extra) if self.layout == "append" else slice(a.shape[2], None)
        out[:, :, real] = a
        out[:, :, holes] = 0

    def _padded(self, mask: np.ndarray, width: int) -> np.ndarray:
        extra = width - mask.shape[1]
        return np.pad(mask, ((0, 0), (extra, 0) if self.layout == "append" else (0, extra)))

    def take(self, rows) -> KVCache:
        """A new cache of ``rows`` (copied, without a store), with all the columns."""
        rows = np.asarray(rows, dtype=np.int64)
        return KVCache(
            self.layout,
            [a[rows] for a in self.keys],
            [a[rows] for a in self.values],
            self.mask[rows],
            self.lengths[rows],
        )

    def assign(self, other: KVCache) -> None:
        """Hold ``other``'s rows instead of this cache's (copied into the store, if any)."""
        self.mask, self.lengths = other.mask, other.lengths
        self._adopt(other.keys, other.values)

    def leave(self, rows: list[int]) -> None:
        """Drop ``rows`` and then the columns that are holes in every row left."""
        if not rows:
            return
        keep = np.setdiff1d(np.arange(self.rows), np.asarray(rows, dtype=np.int64))
        used = self.mask[keep].any(axis=0) if len(keep) else np.zeros(self.columns, bool)
        if self.layout in LEFT_ALIGNED:
            width = int(self.lengths[keep].max()) if len(keep) else 0
            cols = np.arange(width)
        else:
            cols = np.flatnonzero(used)
        if len(cols) == self.columns:
            cols = slice(None)
        elif self.layout in LEFT_ALIGNED or (len(cols) and cols[-1] - cols[0] + 1 == len(cols)):
            cols = slice(int(cols[0]), int(cols[-1]) + 1) if len(cols) else slice(0, 0)
        self.mask = np.ascontiguousarray(self.mask[keep][:, cols])
        self.lengths = self.lengths[keep]
        keys, values = self._target(len(keep), self.mask.shape[1])
        for out, a in zip(keys + values, self.keys + self.values):
            np.take(a[:, :, cols], keep, axis=0, out=out, mode="clip")
        self._adopt(keys, values)
        if self.store is not None and keys:
            # the pages past what the next step writes go back (all of them when no row is left)
            _, heads, columns, dim = keys[0].shape
            self.store.trim(len(keep) * heads * (columns + 1) * dim)
