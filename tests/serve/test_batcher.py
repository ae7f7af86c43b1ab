"""The dynamic batcher in-process: what it stacks, what it keeps apart, and how it fails.

The model is a function that records each batch it is given; a gate holds the first run so that
the requests after it are all waiting when the next batch forms (no timing involved).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from modelpress.serve.batcher import Batcher
from modelpress.serve.errors import Overloaded


class Model:
    """y = 2x + row sum; refuses a batch that holds a negative number (like an index out of range)."""

    def __init__(self):
        self.batches: list[tuple[int, ...]] = []
        self.gate = threading.Event()

    def __call__(self, feeds):
        self.gate.wait(10)
        x = feeds["x"]
        self.batches.append(x.shape)
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": 2 * x + x.reshape(len(x), -1).sum(1).reshape((-1,) + (1,) * (x.ndim - 1))}


def expected(x):
    return 2 * x + x.reshape(len(x), -1).sum(1).reshape((-1,) + (1,) * (x.ndim - 1))


def run(coro):
    return asyncio.run(coro)


async def _submit_all(batcher, model, requests, keys):
    first = asyncio.ensure_future(batcher.submit({"x": requests[0]}, len(requests[0]), keys[0]))
    await asyncio.sleep(0.05)  # the first request is running, held by the gate
    rest = [
        asyncio.ensure_future(batcher.submit({"x": x}, len(x), k))
        for x, k in zip(requests[1:], keys[1:])
    ]
    await asyncio.sleep(0)
    model.gate.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def test_waiting_requests_of_one_shape_run_as_one_batch_and_each_gets_its_rows():
    model = Model()
    rng = np.random.default_rng(0)
    requests = [rng.random((n, 3), dtype=np.float32) for n in (1, 2, 1, 3, 1)]

    async def main():
        b = Batcher("m", model, max_batch=16, max_delay_s=0)
        try:
            return await _submit_all(b, model, requests, [((3,),)] * 5)
        finally:
            await b.close()

    results = run(main())
    assert model.batches == [(1, 3), (7, 3)]
    for x, out in zip(requests, results):
        np.testing.assert_array_equal(out["y"], expected(x))


def test_shapes_past_axis_0_are_never_mixed_and_max_batch_caps_rows():
    model = Model()
    rng = np.random.default_rng(1)
    shapes = [(1, 3), (2, 3), (1, 4), (2, 3), (2, 4), (3, 3)]
    requests = [rng.random(s, dtype=np.float32) for s in shapes]
    keys = [(s[1:],) for s in shapes]

    async def main():
        b = Batcher("m", model, max_batch=4, max_delay_s=0)
        try:
            return await _submit_all(b, model, requests, keys)
        finally:
            await b.close()

    results = run(main())
    # after the held first run: the (x, 3) requests in FIFO order up to 4 rows, the (x, 4) ones, the rest
    assert model.batches == [(1, 3), (4, 3), (3, 4), (3, 3)]
    for x, out in zip(requests, results):
        np.testing.assert_array_equal(out["y"], expected(x))


def test_requests_with_no_key_run_alone():
    model = Model()
    requests = [np.full((1, 2), i, np.float32) for i in range(4)]

    async def main():
        b = Batcher("m", model, max_batch=8, max_delay_s=0)
        try:
            return await _submit_all(b, model, requests, [None] * 4)
        finally:
            await b.close()

    results = run(main())
    assert model.batches == [(1, 2)] * 4
    for x, out in zip(requests, results):
        np.testing.assert_array_equal(out["y"], expected(x))


def test_a_request_that_breaks_its_batch_fails_alone():
    model = Model()
    requests = [
        np.ones((1, 2), np.float32),
        np.ones((2, 2), np.float32),
        -np.ones((1, 2), np.float32),
        np.full((1, 2), 3, np.float32),
    ]

    async def main():
        b = Batcher("m", model, max_batch=8, max_delay_s=0)
        try:
            return await _submit_all(b, model, requests, [((2,),)] * 4)
        finally:
            await b.close()

    results = run(main())
    # the batch of the last three failed, then each ran alone
    assert model.batches == [(1, 2), (4, 2), (2, 2), (1, 2), (1, 2)]
    assert isinstance(results[2], ValueError)
    for i in (0, 1, 3):
        np.testing.assert_array_equal(results[i]["y"], expected(requests[i]))


def test_outputs_that_are_not_one_row_per_input_row_are_rerun_alone():
    calls = []

    def pooled(feeds):
        calls.append(len(feeds["x"]))
        return {"y": feeds["x"].sum(0, keepdims=True)}  # one row for the whole batch

    async def main():
        b = Batcher("m", pooled, max_batch=8, max_delay_s=0.2, arriving=lambda: 1)
        try:
            futures = [
                b.submit({"x": np.full((1, 2), i, np.float32)}, 1, ((2,),)) for i in range(3)
            ]
            return await asyncio.gather(*futures)
        finally:
            await b.close()

    results = run(main())
    assert calls == [3, 1, 1, 1]
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1, 2), i, np.float32))


def test_a_full_queue_refuses_at_once_and_drops_nothing_accepted():
    model = Model()

    async def main():
        b = Batcher("m", model, max_batch=1, max_delay_s=0, max_queue=2)
        try:
            first = asyncio.ensure_future(b.submit({"x": np.zeros((1, 1), np.float32)}, 1, ((1,),)))
            await asyncio.sleep(0.05)  # running (held): the queue is empty again
            queued = [
                asyncio.ensure_future(b.submit({"x": np.full((1, 1), i, np.float32)}, 1, ((1,),)))
                for i in (1, 2)
            ]
            await asyncio.sleep(0)
            with pytest.raises(Overloaded) as info:
                await b.submit({"x": np.zeros((1, 1), np.float32)}, 1, ((1,),))
            assert info.value.status == 503 and "--max-queue 2" in info.value.message
            model.gate.set()
            return await asyncio.gather(first, *queued)
        finally:
            await b.close()

    results = run(main())
    assert [float(r["y"][0, 0]) for r in results] == [0.0, 3.0, 6.0]


def test_the_delay_waits_only_while_requests_are_arriving():
    model = Model()
    model.gate.set()
    arriving = [0]

    async def main():
        b = Batcher("m", model, max_batch=8, max_delay_s=5.0, arriving=lambda: arriving[0])
        try:
            # nobody arriving: runs at once despite the 5 s delay
            await asyncio.wait_for(b.submit({"x": np.ones((1, 1), np.float32)}, 1, ((1,),)), 2)
            arriving[0] = 2  # two more on their way: the first waits for them
            first = asyncio.ensure_future(b.submit({"x": np.ones((1, 1), np.float32)}, 1, ((1,),)))
            await asyncio.sleep(0.05)
            assert not first.done()
            arriving[0] = 0
            rest = [b.submit({"x": np.ones((1, 1), np.float32)}, 1, ((1,),)) for _ in range(2)]
            await asyncio.wait_for(asyncio.gather(first, *rest), 2)
        finally:
            await b.close()

    run(main())
    assert model.batches == [(1, 1), (3, 1)]
