"""Continuous batching on a tiny transformers model driven through the decoder contract:
batched equals solo, rows join and leave, cancel frees a slot, limits, the asyncio API."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from generate_testing import (
    FakeLLM,
    LeftAlignedTorchDecoder,
    TorchDecoder,
    decoder_config,
    tiny_llama,
    tiny_tokenizer,
)

from modelpress.errors import InputError, OptionError
from modelpress.runtime.generate import (
    GenerationMetrics,
    QueueFullError,
    Request,
    SamplingParams,
    Scheduler,
)

PROMPTS = ["The quick brown", "Once upon a time there", "Models run", "Grüße aus Köln: 東京"]


@pytest.fixture(scope="module")
def parts():
    tok = tiny_tokenizer()
    return tok, tiny_llama(tok.get_vocab_size(), seed=1)


def _llm(parts, layout="append"):
    tok, model = parts
    decoder = TorchDecoder(model) if layout == "append" else LeftAlignedTorchDecoder(model)
    return FakeLLM(decoder, decoder_config(model, kv_layout=layout), tok)


def _req(prompt, n=12, **kw):
    return Request(prompt=prompt, params=SamplingParams(max_tokens=n, ignore_eos=True, **kw))


def _solo(llm, request):
    return Scheduler(llm, max_seqs=1).run([request])[0]


@pytest.mark.parametrize("layout", ["append", "left_aligned"])
def test_batched_equals_solo_and_rows_join_and_leave(parts, layout):
    llm = _llm(parts, layout)
    lengths = [5, 12, 9, 12]
    requests = [_req(p, n) for p, n in zip(PROMPTS, lengths)]
    solo = [_solo(llm, _req(p, n)) for p, n in zip(PROMPTS, lengths)]
    llm.decoder.calls.clear()
    scheduler = Scheduler(llm, max_seqs=2)
    batched = scheduler.run(requests)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]  # exact, fp32
    assert [len(r.token_ids) for r in batched] == lengths
    assert [r.text for r in batched] == [r.text for r in solo]
    # the third prompt was prefilled alone while two rows were running, then decoded with them
    calls = [tuple(c) for c in llm.decoder.calls]
    third = len(llm.prompt_ids(PROMPTS[2]))
    at = calls.index((1, third))
    assert calls[at - 1] == (2, 1) and calls[at + 1] == (2, 1)
    assert scheduler.engine.cache.rows == 0 and scheduler.engine.cache.columns == 0


@pytest.mark.parametrize("layout", ["append", "left_aligned"])
def test_a_long_prompt_runs_a_chunk_a_step_between_the_running_rows_steps(parts, layout):
    """A prompt that arrives while others generate holds them up for one chunk a step, not
    for its whole length; its answer and theirs are what each gets alone."""
    llm = _llm(parts, layout)
    chunk = 4
    long_prompt = f"{PROMPTS[1]} {PROMPTS[0]} {PROMPTS[2]}"
    n = len(llm.prompt_ids(long_prompt))
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    assert len(sizes) >= 4
    running = _req(PROMPTS[0], len(sizes) + 8)
    arriving = _req(long_prompt, 6)
    scheduler = Scheduler(llm, max_seqs=2, prefill_chunk=chunk)
    results = {}

    def sink(event):
        results.setdefault(event.request_id, []).append(event)

    first = scheduler.add(running, sink)
    scheduler.step()  # alone: its whole prompt (in chunks) and a first decode step
    llm.decoder.calls.clear()
    second = scheduler.add(arriving, sink)
    while second.request_id not in results:
        scheduler.step()
        if not results.get(second.request_id):
            assert scheduler.stats()["prefilling"] == 1
    calls = [tuple(c) for c in llm.decoder.calls]
    want = []
    for i, size in enumerate(sizes):  # each chunk, then a decode step of the running rows
        want += [(1, size), (2, 1) if i == len(sizes) - 1 else (1, 1)]
    assert calls == want
    while scheduler.engine.active:
        scheduler.step()
    for req, seq in ((running, first), (arriving, second)):
        alone = Scheduler(llm, max_seqs=1, prefill_chunk=chunk).run([req])[0]
        assert results[seq.request_id][-1].result.token_ids == alone.token_ids


def test_a_prompt_cancelled_while_it_is_prefilled_frees_its_slot(parts):
    llm = _llm(parts)
    scheduler = Scheduler(llm, max_seqs=2, prefill_chunk=2)
    ended = {}

    def sink(event):
        if event.finished:
            ended[event.request_id] = event.result

    running = scheduler.add(_req(PROMPTS[0], 30), sink)
    scheduler.step()
    long = scheduler.add(_req(f"{PROMPTS[1]} {PROMPTS[3]}", 4), sink)
    scheduler.step()
    assert scheduler.stats()["prefilling"] == 1
    waiting = scheduler.add(_req(PROMPTS[2], 3), sink)
    scheduler.step()
    assert waiting.request_id not in ended and scheduler.stats()["waiting"] == 1  # no slot
    scheduler.cancel(long.request_id)
    scheduler.step()
    assert ended[long.request_id].finish_reason == "cancelled"
    assert ended[long.request_id].token_ids == []
    assert scheduler.stats()["waiting"] == 0  # the slot went to the waiting request at once
    while scheduler.engine.active:
        scheduler.step()
    assert ended[waiting.request_id].token_ids == _solo(llm, _req(PROMPTS[2], 3)).token_ids
    assert ended[running.request_id].token_ids == _solo(llm, _req(PROMPTS[0], 30)).token_ids


def test_seeded_sampling_is_the_same_batched_or_alone(parts):
    llm = _llm(parts)
    kw = dict(temperature=0.9, top_k=50, top_p=0.95, seed=3)
    solo = [_solo(llm, _req(p, 10, **kw)).token_ids for p in PROMPTS]
    batched = Scheduler(llm, max_seqs=4).run([_req(p, 10, **kw) for p in PROMPTS])
    assert [r.token_ids for r in batched] == solo
    other = _solo(llm, _req(PROMPTS[0], 10, **{**kw, "seed": 4})).token_ids
    assert other != solo[0]


def test_cancel_frees_the_slot_at_the_next_step(parts):
    llm = _llm(parts)
    scheduler = Scheduler(llm, max_seqs=1)
    got = {}
    first = scheduler.add(
        _req(PROMPTS[0], 50), lambda e: got.setdefault(e.request_id, []).append(e)
    )
    second = scheduler.add(
        _req(PROMPTS[1], 6), lambda e: got.setdefault(e.request_id, []).append(e)
    )
    for _ in range(3):
        scheduler.step()
    assert [s.request_id for s in scheduler.engine.running] == [first.request_id]
    scheduler.cancel(first.request_id)
    scheduler.step()
    assert [s.request_id for s in scheduler.engine.running] == [second.request_id]
    last = got[first.request_id][-1].result
    assert last.finish_reason == "cancelled" and len(last.token_ids) == 4
    while scheduler.engine.running:
        scheduler.step()
    assert got[second.request_id][-1].result.token_ids == _solo(llm, _req(PROMPTS[1], 6)).token_ids


def test_eos_and_stop_strings_end_a_sequence(parts):
    llm = _llm(parts)
    free = _solo(llm, _req(PROMPTS[1], 16))
    eos = free.token_ids[5]
    first = free.token_ids.index(eos)
    r = _solo(
        llm, Request(prompt=PROMPTS[1], params=SamplingParams(max_tokens=16, eos_token_ids=(eos,)))
    )
    assert r.finish_reason == "stop" and r.token_ids == free.token_ids[: first + 1]
    stop = free.text[3:5]
    r = _solo(
        llm,
        Request(
            prompt=PROMPTS[1], params=SamplingParams(max_tokens=16, stop=(stop,), ignore_eos=True)
        ),
    )
    assert r.finish_reason == "stop" and r.stop == stop
    assert r.text == free.text[: free.text.index(stop)] and stop not in r.text


def test_limits_are_refused_naming_them(parts):
    llm = _llm(parts)
    scheduler = Scheduler(llm, max_seqs=2, max_context=20)
    with pytest.raises(InputError, match=r"context limit of 20 tokens \(`max_context`\)"):
        scheduler.add(_req(PROMPTS[1], 16), print)
    with pytest.raises(InputError, match="`prompt_ids`"):
        scheduler.add(Request(prompt_ids=[5, 10_000]), print)
    with pytest.raises(OptionError, match="`max_seqs`"):
        Scheduler(llm, max_seqs=0)
    with pytest.raises(OptionError, match="`max_context`"):
        Scheduler(llm, max_context=10_000)
    for bad in (0, 2.5, True):
        with pytest.raises(OptionError, match="`prefill_chunk`"):
            Scheduler(llm, prefill_chunk=bad)
    assert scheduler.stats()["waiting"] == 0
    full = Scheduler(llm, max_seqs=1, max_waiting=1)
    full.add(_req(PROMPTS[0], 4), print)
    with pytest.raises(QueueFullError, match="`max_waiting`"):
        full.add(_req(PROMPTS[1], 4), print)


def test_asyncio_streams_with_the_background_thread_and_a_disconnect(parts):
    llm = _llm(parts)
    seen = {"ttft": [], "itl": [], "done": []}
    metrics = GenerationMetrics(
        on_time_to_first_token=seen["ttft"].append,
        on_inter_token_latency=seen["itl"].append,
        on_finished=seen["done"].append,
    )
    solo = [_solo(llm, _req(p, 8)) for p in PROMPTS[:3]]

    async def main(scheduler):
        async def consume(prompt, stop_after=None):
            stream = await scheduler.submit(_req(prompt, 8))
            texts, result = [], None
            async for event in stream:
                texts.append(event.text)
                result = event.result
                if stop_after is not None and len(texts) == stop_after:
                    break  # the client went away
            await stream.aclose()
            return "".join(texts), result

        return await asyncio.gather(
            consume(PROMPTS[0]), consume(PROMPTS[1], stop_after=2), consume(PROMPTS[2])
        )

    with Scheduler(llm, max_seqs=4, metrics=metrics).start() as scheduler:
        (t0, r0), (t1, r1), (t2, r2) = asyncio.run(main(scheduler))
        for _ in range(100):  # the cancelled request is ended at the next step
            if scheduler.stats()["requests_finished"] == 3:
                break
            asyncio.run(asyncio.sleep(0.01))
        stats = scheduler.stats()
    assert (r0.token_ids, t0) == (solo[0].token_ids, solo[0].text)
    assert (r2.token_ids, t2) == (solo[2].token_ids, solo[2].text)
    assert r1 is None and t1 == solo[1].text[: len(t1)]
    assert stats["requests_cancelled"] == 1 and stats["running"] == 0
    assert len(seen["ttft"]) == 3 and len(seen["done"]) == 3
    assert all(x >= 0 for x in seen["ttft"] + seen["itl"]) and len(seen["itl"]) >= 14
    assert np.isfinite(stats["tokens_per_s"])


def test_a_cancelled_task_frees_its_slot_for_a_waiting_request(parts):
    llm = _llm(parts)
    solo = _solo(llm, _req(PROMPTS[2], 6))

    async def main(scheduler):
        first_token = asyncio.Event()

        async def hog():
            stream = await scheduler.submit(_req(PROMPTS[0], 200))
            async for _ in stream:
                first_token.set()

        task = asyncio.create_task(hog())
        await first_token.wait()
        waiting = await scheduler.submit(_req(PROMPTS[2], 6))  # no free slot: it waits
        assert scheduler.stats()["waiting"] == 1
        task.cancel()  # the client disconnected
        events = [e async for e in waiting]
        return events[-1].result

    with Scheduler(llm, max_seqs=1).start() as scheduler:
        result = asyncio.run(main(scheduler))
        stats = scheduler.stats()
    assert result.token_ids == solo.token_ids
    assert stats["requests_cancelled"] == 1


def test_a_failing_step_or_hook_ends_requests_with_an_error_not_the_loop(parts):
    tok, model = parts
    good = TorchDecoder(model)
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the model broke\nsecond line")
        return good(*args)

    def broken_hook(seconds):
        raise ValueError("exporter bug")

    llm = FakeLLM(flaky, decoder_config(model), tok)
    metrics = GenerationMetrics(on_inter_token_latency=broken_hook)
    scheduler = Scheduler(llm, max_seqs=2, metrics=metrics)
    failed = scheduler.run([_req(PROMPTS[0], 8)])[0]
    assert failed.finish_reason == "error" and failed.error == "the model broke"
    assert scheduler.engine.cache.rows == 0
    again = scheduler.run([_req(PROMPTS[0], 8)])[0]  # the scheduler goes on
    assert again.token_ids == _solo(_llm(parts), _req(PROMPTS[0], 8)).token_ids
    assert metrics.hook_errors == 1 and metrics.on_inter_token_latency is None
