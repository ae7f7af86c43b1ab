"""The batch's KV cache in a two-sided store against the same cache of plain arrays: steps, rows
joining and leaving give equal keys, values and masks, in both layouts; an empty batch gives its
buffers back. The shared store (share mode) the same, its steps writing in place."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from modelpress.ir.llm import DecoderConfig
from modelpress.runtime.generate.cache import KVCache
from modelpress.runtime.generate.kv_store import KVStore, SharedKVStore

LAYERS, HEADS, DIM = 2, 3, 4


def _empty(layout, rows=0, stored=False, shared=False):
    config = DecoderConfig(
        family="llama",
        num_layers=LAYERS,
        num_kv_heads=HEADS,
        head_dim=DIM,
        vocab_size=16,
        max_context=64,
        kv_layout=layout,
    )
    return KVCache.empty(config, rows=rows, stored=stored, shared=shared)


def _step(cache, rng, new=1, *, into_spare=False):
    """A fake decoder step: the present is the past with ``new`` random columns where the layout
    writes them (written into the store's spare buffers when ``into_spare``)."""
    mask, _ = cache.step_inputs(new=new)
    rows, columns = mask.shape
    keys, values = [], []
    spare = cache.spare(new=new) if into_spare else None
    for i, past in enumerate(cache.keys + cache.values):
        present = np.zeros((rows, HEADS, columns, DIM), np.float32)
        fresh = rng.standard_normal((rows, HEADS, new, DIM)).astype(np.float32)
        if cache.layout == "append":
            present[:, :, : past.shape[2]] = past
            present[:, :, past.shape[2] :] = fresh
        else:
            present[:, :, : past.shape[2]] = past
            for b, n in enumerate(cache.lengths):
                present[b, :, n : n + new] = fresh[b]
        if spare is not None:
            out = (spare[0] + spare[1])[i]
            out[...] = present
            present = out
        (keys if i < LAYERS else values).append(present)
    cache.advance(keys, values, mask, new=new)


def _prompt(layout, length, rng):
    cache = _empty(layout, rows=1)
    _step(cache, rng, new=length)
    return cache


def _same(a: KVCache, b: KVCache):
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    for x, y in zip(a.keys + a.values, b.keys + b.values):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("layout", ["append", "left_aligned"])
@pytest.mark.parametrize("into_spare", [False, True])
def test_a_stored_cache_equals_plain_arrays_through_joins_steps_and_leaves(layout, into_spare):
    plain, stored = _empty(layout), _empty(layout, stored=True)
    assert stored.store is not None and plain.store is None
    script = [("join", 5), ("step",), ("join", 2), ("step",), ("step",), ("join", 9), ("step",)]
    script += [("leave", [1]), ("step",), ("join", 3), ("leave", [0, 2]), ("step",), ("step",)]
    script += [("leave", [0, 1])]
    for op in script:
        for cache in (plain, stored):
            rng = np.random.default_rng(len(cache.mask) * 100 + cache.columns)
            if op[0] == "join":
                cache.join(_prompt(layout, op[1], rng))
            elif op[0] == "step":
                _step(cache, rng, into_spare=into_spare and cache is stored)
            else:
                cache.leave(op[1])
        _same(plain, stored)
        if stored.rows:  # the cache is on one side, the next write goes to the other
            assert not stored.store.holds(stored.keys + stored.values)
    assert stored.rows == 0 and stored.columns == 0
    assert stored.store.reserved_bytes() == 0  # an empty batch keeps no buffer


def test_the_store_writes_its_two_sides_in_turn_and_gives_pages_back():
    store = KVStore(2, np.float32)
    first = store.spare((2, 3, 700, 4))
    assert store.holds(first)
    first[0][...] = 1.0
    store.flip()
    second = store.spare((2, 3, 6, 4))
    assert not any(np.may_share_memory(a, b) for a in first for b in second)
    store.flip()
    again = store.spare((2, 3, 7, 4))  # the first side again, the cache now being the second's
    assert np.may_share_memory(again[0], first[0])
    store.trim(10)  # the pages past the first 10 elements go back: they read as zeros again
    flat = first[0].reshape(-1)
    page = mmap.PAGESIZE // 4
    assert (flat[:page] == 1).all() and (flat[page:] == 0).all()
    assert store.reserved_bytes() > 0
    store.trim(0)
    assert store.reserved_bytes() == 0


def _step_in_place(cache, rng, new=1):
    """``_step``'s fresh entries written the way GroupQueryAttention's share mode does: into the
    whole buffers of ``in_place``, at each row's length, nothing else touched."""
    mask, _ = cache.step_inputs(new=new)
    keys, values = cache.in_place(new=new)
    fresh = rng.standard_normal((2 * LAYERS, cache.rows, HEADS, new, DIM)).astype(np.float32)
    for i, full in enumerate(keys + values):
        assert full.flags.c_contiguous and full.shape[2] >= mask.shape[1]
        for b, n in enumerate(cache.lengths):
            full[b, :, n : n + new] = fresh[i, b]
    cache.advance(keys, values, mask, new=new)


def _step_plain(cache, rng, new=1):
    mask, _ = cache.step_inputs(new=new)
    fresh = rng.standard_normal((2 * LAYERS, cache.rows, HEADS, new, DIM)).astype(np.float32)
    arrays = []
    for i, past in enumerate(cache.keys + cache.values):
        present = np.zeros((cache.rows, HEADS, mask.shape[1], DIM), np.float32)
        present[:, :, : past.shape[2]] = past
        for b, n in enumerate(cache.lengths):
            present[b, :, n : n + new] = fresh[i, b]
        arrays.append(present)
    cache.advance(arrays[:LAYERS], arrays[LAYERS:], mask, new=new)


@pytest.mark.parametrize("reserve", [0, 40])
def test_a_shared_cache_equals_plain_arrays_and_grows_when_short(reserve):
    """With ``reserve`` 0 every layout has one spare column and the steps double it; with 40
    the layouts have room and the steps never copy."""
    plain, shared = _empty("left_aligned"), _empty("left_aligned", shared=True)
    store = shared.store
    assert isinstance(store, SharedKVStore) and shared.spare() is None
    script = [("join", 5), ("step",), ("join", 2), ("step",), ("step",), ("join", 9), ("step",)]
    script += [("leave", [1]), ("step",), ("join", 3), ("leave", [0, 2]), ("step",), ("step",)]
    script += [("step",)] * 6 + [("leave", [0, 1])]
    relaid, capacities = [], []  # per step: whether it laid the buffers out anew
    for op in script:
        shared.reserve(reserve)
        before = store.full()
        for cache in (plain, shared):
            rng = np.random.default_rng(len(cache.mask) * 100 + cache.columns)
            if op[0] == "join":
                cache.join(_prompt("left_aligned", op[1], rng))
            elif op[0] == "step":
                (_step_plain if cache is plain else _step_in_place)(cache, rng)
            else:
                cache.leave(op[1])
        _same(plain, shared)
        if shared.rows:
            full = store.full()
            assert all(np.shares_memory(a, f) for a, f in zip(shared.keys + shared.values, full))
            capacities.append(store.capacity())
            if op[0] == "step":
                relaid.append(full[0] is not before[0])
    if reserve:
        assert set(capacities) == {40} and not any(relaid)
    else:  # one spare column a layout: the steps doubled it, past the longest row's 9 + 9
        assert any(relaid) and not all(relaid) and max(capacities) > 18
    assert shared.rows == 0 and store.full() is None and store.reserved_bytes() == 0


def test_a_bounded_store_lays_out_aligned_widths_with_a_masked_column():
    """The ``in_place`` layout's store: every width a multiple of ``ALIGN`` with at least one
    column past the step's, at most about twice the columns whatever the reserve, and the whole
    reserve short of ``limit`` for the unbounded store (GroupQueryAttention's)."""
    from modelpress.runtime.generate.kv_store import ALIGN, aligned

    bounded = SharedKVStore(2, np.float32, limit=10_000, bounded=True)
    unbounded = SharedKVStore(2, np.float32, limit=10_000)
    for columns in (1, 5, 62, 63, 64, 100, 500):
        for reserve in (0, columns + 3, 5_000):
            bounded.reserve = unbounded.reserve = reserve
            bounded.spare((2, HEADS, columns, DIM))
            bounded.flip()
            capacity = bounded.capacity()
            assert capacity % ALIGN == 0 and capacity >= columns + 2, (columns, reserve, capacity)
            assert capacity <= aligned(max(2 * columns, columns + 1)), (columns, reserve, capacity)
            unbounded.spare((2, HEADS, columns, DIM))
            unbounded.flip()
            assert unbounded.capacity() == max(reserve, columns + 1)
    assert aligned(ALIGN - 1) == ALIGN and aligned(ALIGN) == 2 * ALIGN and aligned(1) == ALIGN
