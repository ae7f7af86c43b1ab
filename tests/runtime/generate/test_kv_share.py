"""Share mode (``cache.py``, ``kv_store.SharedKVStore``): on left-aligned decoders (ONNX
Runtime's GroupQueryAttention at the ``ort`` level, ScatterND into the past at the standard
level's ``in_place`` layout) a step's past and present are the same buffers, written in place.
Its greedy tokens against the two-sided path's (``open_llm(share=False)``), token for token: at
batch 1, with rows of different lengths joining and leaving, and with buffers that must grow;
for llama, a GQA family (qwen2), Phi-3's long rope (rows stepped apart around its switch), a
sliding window with soft-capping (gemma2) and learned positions (gpt2, standard level)."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.errors import ConversionError
from modelpress.runtime.generate import Generator, open_llm
from modelpress.runtime.generate.kv_store import SharedKVStore

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a little",
    "ONNX",
    "Hello world! How are",
    "Quantization trades a little accuracy for",
]
MAX_TOKENS = [12, 5, 20, 9, 16]  # rows leave at different steps


def _folder(root, family, level):
    from modelpress.convert.llm import convert_llm
    from modelpress.zoo.llm import tiny_checkpoint

    ckpt = tiny_checkpoint(root / f"{family}-hf", family, seed=3)
    out = root / f"{family}-{level}-llm"
    try:
        convert_llm(ckpt, output=out, level=level, verify=False)
    except ConversionError as exc:
        pytest.skip(f"level {level!r} does not convert {family}: {exc}")
    return out


@pytest.fixture(
    scope="module",
    params=[
        ("llama", "ort"),
        ("qwen2", "ort"),
        ("phi3-longrope", "ort"),
        ("gemma2", "ort"),
        ("llama", "standard"),
        ("phi3-longrope", "standard"),
        ("gemma2", "standard"),
        ("gpt2", "standard"),
    ],
    ids="-".join,
)
def folder(request, tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("share"), *request.param)


def _tokens(gen: Generator, *, max_seqs: int) -> list[list[int]]:
    from modelpress.runtime.generate import Request, SamplingParams

    gen.scheduler.max_seqs = max_seqs
    requests = [
        Request(prompt=p, params=SamplingParams(max_tokens=n, ignore_eos=True))
        for p, n in zip(PROMPTS, MAX_TOKENS)
    ]
    return [r.token_ids for r in gen.scheduler.run(requests)]


def _pair(folder):
    shared = Generator(open_llm(folder, threads=1))
    plain = Generator(open_llm(folder, threads=1, share=False))
    assert shared.scheduler.engine.shared and not plain.scheduler.engine.shared
    assert isinstance(shared.scheduler.engine.cache.store, SharedKVStore)
    return shared, plain


@pytest.mark.parametrize("max_seqs", [1, 3])
def test_shared_buffers_give_the_same_greedy_tokens(folder, max_seqs):
    shared, plain = _pair(folder)
    written = []
    store = shared.scheduler.engine.cache.store
    original = store.written_in_place

    def spy(arrays):
        written.append(original(arrays))
        return written[-1]

    store.written_in_place = spy
    want = _tokens(plain, max_seqs=max_seqs)
    assert _tokens(shared, max_seqs=max_seqs) == want
    assert [len(t) for t in want] == MAX_TOKENS
    # every decode step wrote in place (prompts go through the two-sided path, alone), but
    # those that run rows on either side of Phi-3's rope switch apart (copies of the rows)
    steps = shared.scheduler.engine.steps
    if shared.llm.config.prefill_again_after is None:
        assert steps > 0 and sum(written) == steps, (sum(written), steps)
    else:
        assert 0 < sum(written) <= steps
    assert store.full() is None  # every row left: the buffers went back


def test_buffers_too_small_grow_by_doubling(folder, monkeypatch):
    from modelpress.runtime.generate import kv_store

    monkeypatch.setattr(kv_store, "ALIGN", 2)  # widths small enough to grow here
    shared, plain = _pair(folder)
    engine = shared.scheduler.engine
    engine.cache.reserve = lambda columns: None  # no room planned: every layout is the minimum
    capacities = []
    original = engine.cache.in_place

    def spy(new=1):
        out = original(new)
        capacities.append(out[0][0].shape[2])
        return out

    engine.cache.in_place = spy
    assert _tokens(shared, max_seqs=3) == _tokens(plain, max_seqs=3)
    grown = sorted(set(capacities))
    assert len(grown) > 2 and all(b <= 2 * a for a, b in zip(grown, grown[1:])), grown


def test_the_buffers_are_bound_as_past_and_present(folder):
    """A step through the shared buffers leaves the entries before each row's length untouched
    and writes the new one at the length, like the two-sided step's present."""
    llm = open_llm(folder, threads=1)
    engine = Generator(llm).scheduler.engine
    ids = [llm.prompt_ids(p) for p in PROMPTS[:3]]
    from modelpress.runtime.generate.sampling import SamplingParams
    from modelpress.runtime.generate.sequence import Sequence

    seqs = [
        Sequence(str(i), x, SamplingParams(max_tokens=8), frozenset(), llm.tokenizer)
        for i, x in enumerate(ids)
    ]
    engine.admit(seqs)
    engine.prefill()
    cache = engine.cache
    before = [a.copy() for a in cache.keys]
    lengths = cache.lengths.copy()
    token = np.asarray([[s.token_ids[-1]] for s in seqs], dtype=np.int64)
    mask, positions = cache.step_inputs(new=1)
    plain_logits, plain_keys, _ = llm.decoder(token, mask, positions, cache.keys, cache.values)
    full = cache.in_place(new=1)
    assert full[0][0].shape[2] > cache.columns + 1  # room reserved for the tokens to come
    logits, keys, values = llm.decoder(token, mask, positions, *full, present=full)
    assert keys[0] is full[0][0]
    np.testing.assert_array_equal(logits, plain_logits)  # the wide mask changes no bit
    for layer, (k, old, new) in enumerate(zip(keys, before, plain_keys)):
        for b, n in enumerate(lengths):
            np.testing.assert_array_equal(k[b, :, :n], old[b, :, :n], err_msg=f"layer {layer}")
            np.testing.assert_allclose(k[b, :, n], new[b, :, n], rtol=0, atol=1e-6)


def test_the_cache_is_the_first_columns_of_the_buffers_and_logits_the_bound_output(folder):
    """After a step in place the cache's arrays are the buffers' first columns, sliced when
    read (``cache._Columns``); a shared step's logits are its bound output buffer, rewritten
    by the next step (the engine chooses from them first)."""
    llm = open_llm(folder, threads=1)
    engine = Generator(llm).scheduler.engine
    from modelpress.runtime.generate.sampling import SamplingParams
    from modelpress.runtime.generate.sequence import Sequence

    seqs = [
        Sequence(
            str(i), llm.prompt_ids(p), SamplingParams(max_tokens=8), frozenset(), llm.tokenizer
        )
        for i, p in enumerate(PROMPTS[:2])
    ]
    engine.admit(seqs)
    engine.prefill()
    engine.decode()
    cache = engine.cache
    full = cache.store.full()
    layers = llm.config.num_layers
    keys, values = cache.keys, cache.values
    assert len(keys) == len(values) == layers
    for i, (k, v) in enumerate(zip(keys, values)):
        assert k.shape == (2, llm.config.num_kv_heads, cache.columns, llm.config.head_dim)
        assert np.shares_memory(k, full[i]) and np.shares_memory(v, full[layers + i])
        np.testing.assert_array_equal(k, full[i][:, :, : cache.columns])
    both = keys + values
    assert isinstance(both, list) and len(both) == 2 * layers
    assert [a.shape for a in keys[0:2]] == [keys[0].shape, keys[1].shape]
    np.testing.assert_array_equal(cache.mask.sum(axis=1), cache.lengths)
    token = np.asarray([[s.token_ids[-1]] for s in seqs], dtype=np.int64)
    mask, positions = cache.step_inputs(new=1)
    shared = cache.in_place(new=1)
    first, *_ = llm.decoder(token, mask, positions, *shared, present=shared)
    kept = first.copy()
    cache.advance(*shared, mask, new=1)
    mask, positions = cache.step_inputs(new=1)
    shared = cache.in_place(new=1)
    second, *_ = llm.decoder(token, mask, positions, *shared, present=shared)
    assert np.shares_memory(first, second)  # the same output buffer
    assert not np.array_equal(kept, second)  # written anew (another position)
