"""Open-loop load: requests sent at Poisson arrival times, whatever the server answers.

A closed loop (N clients, each waiting for its answer before sending again) slows down with the
server and hides its queue; real traffic does not wait. Here the arrival times are drawn first
(exponential gaps at ``rate`` per second, a fixed seed), each request is sent at its time on a free
keep-alive connection (a new one when all are busy), and its latency is counted from its
*scheduled* time to the last byte of the answer, so a client that fell behind still charges the
delay to the server (no coordinated omission). The load is bounded in requests and in time; the
first ``warmup_s`` of arrivals are sent but not counted. Requests still unanswered ``timeout_s``
after the last arrival count as failures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LoadResult:
    rate: float  # requests per second asked
    offered: float  # requests per second the drawn arrivals make (Poisson: near ``rate``)
    sent: int  # counted requests (after the warm-up)
    answered: int  # of those, answered 200
    failed: int  # other statuses, connection errors, timeouts
    seconds: float  # from the first counted arrival to the last counted answer
    throughput: float  # answered per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    connections: int  # the most connections open at once

    def to_dict(self) -> dict:
        # JSON has no infinity: a p99 past the answered requests is written as null
        return {
            k: (None if isinstance(v, float) and not np.isfinite(v) else v)
            for k, v in asdict(self).items()
        }


def http_request(path: str, body: bytes, *, host: str = "127.0.0.1") -> bytes:
    """One HTTP/1.1 POST with a JSON body, as bytes ready to send."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(reader, writer, request: bytes) -> tuple[int, int]:
    """Send one request, read its answer: (status, body bytes)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        low = line.lower()
        if low.startswith(b"content-length:"):
            length = int(line[15:])
        elif low == b"transfer-encoding: chunked":
            chunked = True
    if chunked:
        length = 0
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            await reader.readexactly(size + 2)
            length += size
        await reader.readuntil(b"\r\n")
    else:
        await reader.readexactly(length)
    return status, length


class _Pool:
    def __init__(self, host: str, port: int, limit: int):
        self.host, self.port, self.limit = host, port, limit
        self.idle: list = []
        self.open = self.most = 0
        self.free = asyncio.Condition()

    async def take(self):
        async with self.free:
            while not self.idle and self.open >= self.limit:
                await self.free.wait()
            if self.idle:
                return self.idle.pop()
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError:
            async with self.free:  # (the connection never opened: free its place)
                self.open -= 1
                self.free.notify()
            raise

    async def give(self, conn) -> None:
        async with self.free:
            self.idle.append(conn)
            self.free.notify()

    async def drop(self, conn) -> None:
        conn[1].close()
        async with self.free:
            self.open -= 1
            self.free.notify()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def _run(
    host: str,
    port: int,
    request: bytes,
    arrivals: np.ndarray,
    counted_from: int,
    timeout_s: float,
    max_connections: int,
):
    pool = _Pool(host, port, max_connections)
    latencies = np.full(len(arrivals), np.nan)
    ended = np.full(len(arrivals), np.nan)
    status = np.zeros(len(arrivals), dtype=np.int32)
    start = time.perf_counter() + 0.05

    async def one(i: int) -> None:
        conn = None
        try:
            conn = await pool.take()
            code, _ = await _exchange(*conn, request)
            done = time.perf_counter()
            status[i], latencies[i], ended[i] = code, done - (start + arrivals[i]), done
            await pool.give(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError):
            if conn is not None:
                await pool.drop(conn)

    tasks = []
    for i, t in enumerate(arrivals):
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    done, pending = await asyncio.wait(tasks, timeout=timeout_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    pool.close()
    first = start + arrivals[counted_from] if counted_from < len(arrivals) else start
    return latencies[counted_from:], status[counted_from:], ended[counted_from:], first, pool.most


def open_loop(
    host: str,
    port: int,
    request: bytes,
    *,
    rate: float,
    max_requests: int = 2000,
    max_seconds: float = 10.0,
    warmup_s: float = 1.0,
    timeout_s: float = 10.0,
    max_connections: int = 512,
    seed: int = 0,
) -> LoadResult:
    """Send ``request`` (a whole HTTP request, ``http_request``) at Poisson arrivals of ``rate``
    per second for at most ``max_requests`` counted requests and ``max_seconds`` counted time,
    after ``warmup_s`` of uncounted ones; the latencies and throughput it measured."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = np.random.default_rng(seed)
    horizon = warmup_s + max_seconds
    n = int(rate * horizon * 1.2) + 16
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    warm = int(np.searchsorted(arrivals, warmup_s))
    arrivals = arrivals[arrivals < horizon][: warm + max_requests]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    lat, status, ended, first, most = runner(
        _run(host, port, request, arrivals, warm, timeout_s, max_connections)
    )
    ok = (status == 200) & ~np.isnan(lat)
    good = lat[ok] * 1e3
    # a request that never came back counts as slower than every answer
    all_ms = np.where(ok, lat * 1e3, np.inf)
    last = float(np.nanmax(ended)) if np.isfinite(ended).any() else first
    seconds = float(max(last - first, 1e-9))

    def q(p: float) -> float:
        return float(np.percentile(all_ms, p, method="higher")) if len(all_ms) else float("nan")

    counted = arrivals[warm:]
    span = float(counted[-1] - counted[0]) if len(counted) > 1 else 0.0
    return LoadResult(
        rate=rate,
        offered=(len(counted) - 1) / span if span > 0 else rate,
        sent=len(lat),
        answered=int(ok.sum()),
        failed=int(len(lat) - ok.sum()),
        seconds=seconds,
        throughput=float(ok.sum() / seconds),
        p50_ms=q(50),
        p90_ms=q(90),
        p99_ms=q(99),
        max_ms=float(good.max()) if len(good) else float("nan"),
        connections=most,
    )


__all__ = ["LoadResult", "http_request", "open_loop"]
