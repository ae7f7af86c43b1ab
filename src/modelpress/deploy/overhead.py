"""The server's own cost per request: measured against the real server on this machine.

A plan that counts only the model's time promises too much on a small model: parsing the HTTP
request and its JSON, handing it to the batcher, encoding the answer and writing it back take a
fixed time per request and a time per byte that, for a CNN on digits, are many times the model's
own. ``calibrate`` measures both with the real server (``process.Served``) serving an Identity
model (whose own run is a copy): one request at a time on one keep-alive connection, with a small
and a large JSON body interleaved, the median round trip of each; per byte is the slope between
them, per request the rest, or the machine's time per request with many in flight (closed loops
on 16 connections: the inverse of their throughput) where that is larger. The client's own time
is in it, as it is for any client on the machine. The spread of the one-at-a-time round trips
(p99 - median) is what the plan adds to its p99: the scheduler and other processes.

``request_bodies`` makes the JSON request (and measures the JSON answer) of one sample of a
model, the bytes the plan charges per request.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.deploy.load import _exchange, http_request
from modelpress.deploy.process import Served, ServerSpec
from modelpress.ir import save
from modelpress.serve.protocol import datatype_name

SMALL, LARGE = 4, 16384  # floats per calibration request


@dataclass(frozen=True)
class ServerCost:
    per_request_ms: float  # fixed time per request (HTTP, JSON, batcher, the client's share)
    saturated_rps: float  # small requests per second the server answers with many in flight
    per_kb_ms: float  # time per kilobyte of request and answer bodies
    tail_ms: float  # p99 - median of the small round trips: how much a request's own time varies
    samples: int  # round trips timed per body size
    spread_ms: tuple[float, float]  # p25-p75 of the small round trips
    source: str = "measured: modelpress serve on this machine (Identity model, JSON bodies)"

    def seconds(self, body_bytes: int) -> float:
        """The server's time for one request whose request and answer hold ``body_bytes``."""
        return (self.per_request_ms + self.per_kb_ms * body_bytes / 1024) / 1e3

    def to_dict(self) -> dict:
        return asdict(self)


def _identity(path: Path) -> Path:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "n"]))
    node = ir.Node("", "Identity", inputs=[x], num_outputs=1)
    y = node.outputs[0]
    y.name, y.type, y.shape = "y", ir.TensorType(ir.DataType.FLOAT), ir.Shape(["batch", "n"])
    graph = ir.Graph([x], [y], nodes=[node], opset_imports={"": 17}, name="identity")
    save(ir.Model(graph, ir_version=8), path)
    return path


def json_body(feeds: dict[str, np.ndarray]) -> bytes:
    """A v2 inference request with every input as JSON data."""
    return json.dumps({"inputs": _tensors(feeds)}, separators=(",", ":")).encode()


def _tensors(arrays: dict[str, np.ndarray]) -> list[dict]:
    """Arrays as the protocol's JSON tensors: name, datatype, shape and the data, flat."""
    return [
        {
            "name": k,
            "datatype": datatype_name(v.dtype),
            "shape": list(v.shape),
            "data": v.reshape(-1).tolist(),
        }
        for k, v in arrays.items()
    ]


def answer_bytes(outputs: dict[str, np.ndarray], name: str) -> int:
    """The size of the JSON answer the server writes for ``outputs``."""
    doc = {
        "model_name": name,
        "model_version": "1",
        "outputs": _tensors(outputs),
    }
    return len(json.dumps(doc, separators=(",", ":")).encode())


async def _round_trips(port: int, requests: list[bytes], rounds: int) -> list[list[float]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times: list[list[float]] = [[] for _ in requests]
    try:
        for r in range(rounds):
            for i, request in enumerate(requests):  # interleaved: drift hits both alike
                t0 = time.perf_counter()
                status, _ = await _exchange(reader, writer, request)
                if status != 200:
                    raise RuntimeError(f"calibration request answered {status}")
                if r >= 5:  # the first rounds warm the server up
                    times[i].append(time.perf_counter() - t0)
    finally:
        writer.close()
    return times


async def _saturate(port: int, request: bytes, clients: int, seconds: float) -> float:
    """Requests per second ``clients`` closed loops get from the server (after a warm-up)."""
    done = [0]
    start = time.perf_counter()
    warm, stop = start + seconds / 4, start + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while (now := time.perf_counter()) < stop:
                await _exchange(reader, writer, request)
                if now >= warm:
                    done[0] += 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return done[0] / (time.perf_counter() - warm)


def calibrate(*, rounds: int = 200, clients: int = 16, saturate_s: float = 2.0) -> ServerCost:
    """The server's cost per request and per kilobyte on this machine (module docstring)."""
    rng = np.random.default_rng(0)
    bodies, sizes = [], []
    for n in (SMALL, LARGE):
        x = rng.standard_normal((1, n)).astype(np.float32)
        body = json_body({"x": x})
        bodies.append(http_request("/v2/models/identity/infer", body))
        sizes.append(len(body) + answer_bytes({"y": x}, "identity"))
    with tempfile.TemporaryDirectory(prefix="modelpress-calibrate-") as tmp:
        model = _identity(Path(tmp) / "identity.onnx")
        spec = ServerSpec(str(model), "identity", max_batch=1, max_delay_ms=0.0, max_queue=64)
        with Served(spec) as port:
            small, large = asyncio.run(_round_trips(port, bodies, rounds + 5))
            rate = asyncio.run(_saturate(port, bodies[0], clients, saturate_s))
    t_small, t_large = float(np.median(small)), float(np.median(large))
    per_byte = max(0.0, (t_large - t_small) / (sizes[1] - sizes[0]))
    # A request's cost is its time alone (one at a time), or under load the machine's time per
    # request when many are in flight (the client's share included): whichever is larger.
    per_request = max(0.0, t_small - per_byte * sizes[0], 1.0 / rate - per_byte * sizes[0])
    return ServerCost(
        per_request_ms=per_request * 1e3,
        per_kb_ms=per_byte * 1024 * 1e3,
        saturated_rps=rate,
        tail_ms=float(np.percentile(small, 99) - t_small) * 1e3,
        samples=len(small),
        spread_ms=(float(np.percentile(small, 25) * 1e3), float(np.percentile(small, 75) * 1e3)),
    )


__all__ = ["ServerCost", "answer_bytes", "calibrate", "json_body"]
