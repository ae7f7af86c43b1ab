"""modelpress serve under load: throughput and p50/p99 latency against concurrency, beside the
peers a user would otherwise pick, and the model's own batched ceiling.

For a CNN (zoo ``resnet-digits``) and a BERT-style encoder (zoo ``bert-tiny``, sequence 64), four
servers run side by side on loopback:

- ``modelpress b1``: ``modelpress serve --max-batch 1`` (one request a run);
- ``modelpress``: ``modelpress serve --max-batch 32 --max-delay-ms 2`` (dynamic batching);
- ``ray serve.batch``: a plain Ray Serve deployment whose ``@serve.batch`` method stacks requests
  (max 32, 2 ms), on a local Ray cluster (``ray.init(num_cpus=2)``);
- ``fastapi``: a minimal hand-written FastAPI app running each request alone (a sync handler, as
  such apps are written), on the same uvicorn stack.

The peers take the cheapest possible protocol (raw tensor bytes in, raw bytes out); modelpress
takes v2 requests with binary tensors, as tritonclient sends them. A load generator in its own
process (raw asyncio HTTP/1.1, keep-alive, closed loop: each client sends its next request when
the previous answer arrives) runs each (server, concurrency) for a fixed time after a warm-up and
stops by itself. Servers and concurrencies are interleaved over ``--reps`` rounds; tables give
medians and the min-max spread over rounds.

Ceiling: ONNX Runtime in this process, running back to back the mean batch size the dynamic server
formed at that concurrency (read from its /metrics). Overhead: p50 at concurrency 1 minus the
model's own p50 at batch 1 in-process.

    .venv/bin/python benchmarks/bench_serve.py [--reps 3] [--duration 3]
    .venv/bin/python benchmarks/bench_serve.py --attacks    # the attacks section: bench_serve_attacks.py
    .venv/bin/python benchmarks/bench_serve.py --llm        # the LLM section: bench_serve_llm.py
"""

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "_work" / "serve"
RESULTS = HERE / "results"
CONCURRENCY = (1, 8, 32, 64)
MODELS = {"resnet-digits": None, "bert-tiny": 64}  # zoo name → sequence length
VARIANTS = ("modelpress b1", "modelpress", "ray serve.batch", "fastapi")
LOAD: list[float] = []  # 1-minute load average when the run starts, between models, and at its end


# --- the peers ----------------------------------------------------------------------------------


def _specs(path: str):
    """An ONNX Runtime session and its inputs as (name, shape, type)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(path)
    return sess, [(i.name, i.shape, i.type) for i in sess.get_inputs()]


def _decode(body: bytes, specs, sample_shapes) -> dict[str, np.ndarray]:
    """Raw concatenated input bytes, in input order, for the known per-request shapes."""
    feeds, offset = {}, 0
    for name, _, kind in specs:
        dtype = np.float32 if "float" in kind else np.int64
        shape = sample_shapes[name]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        feeds[name] = np.frombuffer(body[offset : offset + n], dtype=dtype).reshape(shape)
        offset += n
    return feeds


def peer_fastapi(model: str, port: int, shapes: dict) -> None:
    import uvicorn
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import Response

    sess, specs = _specs(model)
    app = FastAPI()

    async def body_of(request: Request) -> bytes:
        return await request.body()

    @app.post("/infer")
    def infer(body: bytes = Depends(body_of)) -> Response:  # noqa: B008 - FastAPI's idiom
        out = sess.run(None, _decode(body, specs, shapes))
        return Response(out[0].tobytes(), media_type="application/octet-stream")

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        http="httptools",
        loop="uvloop",
    )


def peer_ray(model: str, port: int, shapes: dict) -> None:
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 1})
    class Peer:
        def __init__(self):
            self.sess, self.specs = _specs(model)

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
        async def run(self, feeds: list[dict]) -> list[bytes]:
            stacked = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
            out = self.sess.run(None, stacked)[0]
            rows = np.cumsum([len(next(iter(f.values()))) for f in feeds])[:-1]
            return [part.tobytes() for part in np.split(out, rows)]

        async def __call__(self, request: Request) -> Response:
            body = await request.body()
            return Response(
                await self.run(_decode(body, self.specs, shapes)),
                media_type="application/octet-stream",
            )

    serve.run(Peer.bind(), name="peer", route_prefix="/infer")
    print("ready", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.2)
    serve.shutdown()
    ray.shutdown()


# --- the load generator (its own process) ---------------------------------------------------------


async def _client(
    port: int,
    request: bytes,
    start: float,
    warm: float,
    stop: float,
    lat: list,
    errors: list,
    total: list,
):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length, chunked = 0, False
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                elif line.lower() == b"transfer-encoding: chunked":
                    chunked = True
            if chunked:
                while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                    await reader.readexactly(size + 2)
                await reader.readuntil(b"\r\n")
            else:
                await reader.readexactly(length)
            t1 = time.perf_counter()
            total[0] += 1
            if t0 >= warm:
                (lat if status == 200 else errors).append(t1 - t0)
    finally:
        writer.close()


async def _load(
    port: int, request: bytes, concurrency: int, warmup: float, duration: float
) -> dict:
    start = time.perf_counter()
    warm, stop = start + warmup, start + warmup + duration
    lat, errors, total = [], [], [0]
    await asyncio.gather(
        *[_client(port, request, start, warm, stop, lat, errors, total) for _ in range(concurrency)]
    )
    end = time.perf_counter()
    return {
        "count": len(lat),
        "errors": len(errors),
        "total": total[0],
        "seconds": end - warm,
        "lat": lat,
    }


def loadgen(port: int, request_file: str, concurrency: int, warmup: float, duration: float) -> None:
    request = Path(request_file).read_bytes()
    r = asyncio.run(_load(port, request, concurrency, warmup, duration))
    lat = np.array(r.pop("lat")) * 1000
    r["rps"] = r["count"] / r["seconds"]
    r["p50_ms"] = float(np.percentile(lat, 50)) if len(lat) else float("nan")
    r["p99_ms"] = float(np.percentile(lat, 99)) if len(lat) else float("nan")
    print(json.dumps(r))


# --- the driver -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body


def _requests(name: str, feeds: dict[str, np.ndarray]) -> tuple[bytes, bytes]:
    """(v2 binary request for modelpress, raw-bytes request for the peers), one sample each."""
    datatype = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": k,
                    "datatype": datatype[v.dtype],
                    "shape": list(v.shape),
                    "parameters": {"binary_data_size": v.nbytes},
                }
                for k, v in feeds.items()
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    raw = b"".join(v.tobytes() for v in feeds.values())
    v2 = _http_request(
        f"/v2/models/{name}/infer",
        header + raw,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    return v2, _http_request("/infer", raw, {"Content-Type": "application/octet-stream"})


def _wait_ready(port: int, path: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2)
            return
        except Exception:
            time.sleep(0.3)
    raise RuntimeError(f"server on {port} not ready")


def _start(variant: str, model: str, name: str, port: int, shapes: dict) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    if variant.startswith("modelpress"):
        batch = "1" if variant == "modelpress b1" else "32"
        cmd = [
            sys.executable,
            "-m",
            "modelpress.cli.main",
            "serve",
            model,
            "--name",
            name,
            "--port",
            str(port),
            "--max-batch",
            batch,
            "--max-delay-ms",
            "2",
            "--max-queue",
            "1024",
        ]
    else:
        peer = "ray" if variant.startswith("ray") else "fastapi"
        cmd = [
            sys.executable,
            __file__,
            "--peer",
            peer,
            "--model",
            model,
            "--port",
            str(port),
            "--shapes",
            json.dumps(shapes),
        ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    if variant.startswith("modelpress"):
        _wait_ready(port, "/v2/health/ready", proc)
    return proc


def _warm_peer(port: int, request: bytes, proc) -> None:
    """Peers have no health route: wait until a real request is answered."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"peer on {port} exited with {proc.returncode}")
        try:
            r = asyncio.run(_load(port, request, 1, 0.0, 0.2))
            if r["count"]:
                return
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"peer on {port} not ready")


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _counters(port: int) -> tuple[float, float, float]:
    """(rows run, model runs, seconds busy) of a modelpress server so far."""
    return (
        _metric(port, "modelpress_inferences_total"),
        _metric(port, "modelpress_batch_size_count"),
        _metric(port, "modelpress_busy_seconds_total"),
    )


def _run_load(
    port: int, request_file: Path, concurrency: int, warmup: float, duration: float
) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--loadgen",
            "--port",
            str(port),
            "--request",
            str(request_file),
            "--concurrency",
            str(concurrency),
            "--warmup",
            str(warmup),
            "--duration",
            str(duration),
        ],
        capture_output=True,
        text=True,
        timeout=warmup + duration + 120,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _session(path: str):
    import onnxruntime as ort

    return ort.InferenceSession(path)


def _ort_rate(sess, feeds_for, batch: int, seconds: float = 1.0) -> tuple[float, float]:
    """(items/s, p50 ms a run) of ONNX Runtime in-process at ``batch``, runs back to back."""
    feeds = feeds_for(batch)
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return batch / statistics.mean(times), statistics.median(times) * 1000


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu() -> str:
    flags = set()
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", "x86_64"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
    return f"{name}, {os.cpu_count()} cores, {'/'.join(isa) or 'no AVX2'}"


def bench(reps: int, warmup: float, duration: float) -> dict:
    from modelpress import zoo

    WORK.mkdir(parents=True, exist_ok=True)
    results = {}
    for zname, seq in MODELS.items():
        LOAD.append(os.getloadavg()[0])
        path = str(zoo.build(zname, WORK / f"{zname}.onnx"))
        entry = zoo.get(zname)

        def feeds_for(b, entry=entry, seq=seq):
            return {k: np.ascontiguousarray(v) for k, v in entry.inputs(b, seq).items()}

        sample = feeds_for(1)
        shapes = {k: list(v.shape) for k, v in sample.items()}
        v2, raw = _requests(zname, sample)
        (WORK / f"{zname}.v2").write_bytes(v2)
        (WORK / f"{zname}.raw").write_bytes(raw)
        ports = {v: _free_port() for v in VARIANTS}
        procs = {}
        try:
            for v in VARIANTS:
                procs[v] = _start(v, path, zname, ports[v], shapes)
            for v in VARIANTS:
                if not v.startswith("modelpress"):
                    _warm_peer(ports[v], raw, procs[v])
            runs = {(v, c): [] for v in VARIANTS for c in CONCURRENCY}
            batches = {c: [] for c in CONCURRENCY}
            ceilings = {c: [] for c in CONCURRENCY}
            own = []
            sess = _session(path)
            for r in range(reps):
                for c in CONCURRENCY:
                    order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
                    for v in order:
                        req = WORK / f"{zname}.{'v2' if v.startswith('modelpress') else 'raw'}"
                        before = _counters(ports[v]) if v.startswith("modelpress") else None
                        # Ray's replica is another process of the cluster: its CPU is not counted
                        cpu0 = None if v.startswith("ray") else _cpu_seconds(procs[v].pid)
                        res = _run_load(ports[v], req, c, warmup, duration)
                        if cpu0 is not None:
                            res["cpu_ms"] = (
                                (_cpu_seconds(procs[v].pid) - cpu0) / max(res["total"], 1) * 1000
                            )
                        if before:
                            rows, n_runs, busy = (
                                b - a for a, b in zip(before, _counters(ports[v]))
                            )
                            res["mean_batch"] = rows / max(n_runs, 1)
                            res["busy"] = busy / (
                                res["seconds"] + warmup
                            )  # the counters span warm-up too
                            res["ms_per_row"] = busy / max(rows, 1) * 1000
                            if v == "modelpress":
                                batches[c].append(res["mean_batch"])
                        runs[(v, c)].append(res)
                        print(
                            f"{zname} rep {r} c={c:>2} {v:<16} {res['rps']:8.1f} req/s  p50 {res['p50_ms']:7.2f}  p99 {res['p99_ms']:7.2f}  errors {res['errors']}",
                            flush=True,
                        )
                    # the ceiling in the same minute: ORT alone at the mean batch this round formed
                    b = max(1, round(batches[c][-1]))
                    ceilings[c].append(
                        {
                            "batch": b,
                            "mean_batch": batches[c][-1],
                            "rps": _ort_rate(sess, feeds_for, b)[0],
                        }
                    )
                    if c == 1:
                        own.append(_ort_rate(sess, feeds_for, 1)[1])
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        results[zname] = {
            "seq": seq,
            "runs": {f"{v}|{c}": rs for (v, c), rs in runs.items()},
            "ceiling": {str(c): cs for c, cs in ceilings.items()},
            "own_p50_ms": own,
        }
    LOAD.append(os.getloadavg()[0])
    return results


def _med(rs: list[dict], key: str) -> tuple[float, float, float]:
    xs = [r[key] for r in rs]
    return statistics.median(xs), min(xs), max(xs)


def write(results: dict, reps: int, warmup: float, duration: float) -> None:
    import onnxruntime

    lines = [
        "# Serving under load (modelpress serve vs Ray Serve and a hand-written FastAPI app)",
        "",
        f"Machine: {_cpu()} (shared with other jobs); onnxruntime {onnxruntime.__version__}, Python {platform.python_version()}; "
        f"{datetime.date.today()}. No GPU: this task was not lent the GPU machine. Load average of the shared "
        f"machine (other engineers' jobs) during the run: {', '.join(f'{x:.1f}' for x in LOAD)} (start, middle, end).",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_serve.py --reps {reps} --warmup {warmup} --duration {duration}`",
        "",
        "Load: a separate process, closed loop (each client sends its next request when its answer arrives), keep-alive "
        f"HTTP/1.1 on loopback, one sample a request; {warmup} s warm-up then {duration} s measured per (server, concurrency), "
        f"servers interleaved over {reps} rounds. Cells: median over rounds (min-max). The load generator shares the 2 cores "
        "with the server, as a client on the same host would.",
        "",
        "Columns for modelpress, from its /metrics: rows/run (the batches it formed), model busy (the share of the time "
        "the model was running), model ms/row (its busy time per row inside the server: compare the ceiling's, the same "
        "model and batch run back to back in-process). Server CPU: the server process's CPU time per request (Ray's "
        "replica runs in another process of the cluster and is not counted).",
        "",
        "Reading the tables: where the server's model ms/row is close to the ceiling's, the server keeps the model as "
        "busy as running it alone would, and what is left is the model's own curve. Where ms/row grows with rows/run, "
        "this model runs bigger batches slower per row on this machine (every parallel section of a long two-thread "
        "run waits for its slower thread, and other jobs take the cores), and `--max-batch` should be lower. Where the "
        "model is busy a small share of the time, the request path (HTTP, decoding) is the limit, not the model.",
        "",
    ]
    for zname, r in results.items():
        seq = f", sequence {r['seq']}" if r["seq"] else ""
        lines += [
            f"## {zname}{seq}",
            "",
            "| concurrency | server | req/s | p50 ms | p99 ms | server CPU ms/request | rows/run | model busy | model ms/row | errors |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in CONCURRENCY:
            for v in VARIANTS:
                rs = r["runs"][f"{v}|{c}"]
                rps, p50, p99 = _med(rs, "rps"), _med(rs, "p50_ms"), _med(rs, "p99_ms")
                cpu = f"{_med(rs, 'cpu_ms')[0]:.3f}" if "cpu_ms" in rs[0] else "-"
                errs = sum(x["errors"] for x in rs)
                model = (
                    f"{_med(rs, 'mean_batch')[0]:.1f} | {_med(rs, 'busy')[0]:.0%} | {_med(rs, 'ms_per_row')[0]:.3f}"
                    if "busy" in rs[0]
                    else "- | - | -"
                )
                lines.append(
                    f"| {c} | {v} | {rps[0]:.0f} ({rps[1]:.0f}-{rps[2]:.0f}) | {p50[0]:.2f} ({p50[1]:.2f}-{p50[2]:.2f}) | "
                    f"{p99[0]:.2f} ({p99[1]:.2f}-{p99[2]:.2f}) | {cpu} | {model} | {errs} |"
                )
            cs = r["ceiling"][str(c)]
            rate = _med(cs, "rps")
            batch = statistics.median(x["mean_batch"] for x in cs)
            lines.append(
                f"| {c} | *ceiling: ORT in-process at the mean batch formed* | {rate[0]:.0f} ({rate[1]:.0f}-{rate[2]:.0f}) | | | | "
                f"{batch:.1f} | | {1000 / rate[0]:.3f} | |"
            )
        lines.append("")

        def per_round(a: str, b: str, key: str = "rps", r: dict = r) -> float:
            return statistics.median(x[key] / y[key] for x, y in zip(r["runs"][a], r["runs"][b]))

        to_ceiling = statistics.median(
            x["rps"] / y["rps"] for x, y in zip(r["runs"]["modelpress|64"], r["ceiling"]["64"])
        )
        own = statistics.median(r["own_p50_ms"])
        c1 = _med(r["runs"]["modelpress|1"], "p50_ms")[0]
        lines += [
            f"At concurrency 64 (ratios: median over rounds of the ratio within a round): dynamic batching reaches "
            f"**{to_ceiling:.0%} of the ceiling**; {per_round('modelpress|64', 'modelpress b1|64'):.2f}x the throughput of "
            f"`--max-batch 1` with p99 {per_round('modelpress|64', 'modelpress b1|64', 'p99_ms'):.2f}x; "
            f"{per_round('modelpress|64', 'ray serve.batch|64'):.2f}x Ray Serve `@serve.batch`; "
            f"{per_round('modelpress|64', 'fastapi|64'):.2f}x the hand-written FastAPI app.",
            "",
            f"Overhead at concurrency 1: p50 {c1:.2f} ms against the model's own p50 of {own:.2f} ms at batch 1 "
            f"in-process: **{c1 - own:.2f} ms** (HTTP both ways, v2 decoding and encoding, the batcher's thread hand-off, "
            "and the load generator's own parsing).",
            "",
        ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve.md").write_text("\n".join(lines))
    (RESULTS / "serve.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS / 'serve.md'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--triton",
        action="store_true",
        help="run the section beside Triton Inference Server instead (bench_serve_triton.py)",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument(
        "--attacks",
        action="store_true",
        help="run the hostile-client section instead (bench_serve_attacks.py)",
    )
    ap.add_argument(
        "--llm",
        action="store_true",
        help="run the decoder-LLM section instead (bench_serve_llm.py)",
    )
    ap.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", choices=["fastapi", "ray"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    ap.add_argument("--request", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attacks:
        sys.path.insert(0, str(HERE))
        import bench_serve_attacks

        return bench_serve_attacks.main(
            ["--reps", str(args.reps), "--duration", str(args.duration)]
        )
    if args.llm:
        sys.path.insert(0, str(HERE))
        import bench_serve_llm

        return bench_serve_llm.main(["--reps", str(args.reps)])
    if args.loadgen:
        return loadgen(args.port, args.request, args.concurrency, args.warmup, args.duration)
    if args.peer:
        shapes = json.loads(args.shapes)
        return (peer_fastapi if args.peer == "fastapi" else peer_ray)(args.model, args.port, shapes)
    if args.triton:
        sys.path.insert(0, str(HERE))
        import bench_serve_triton

        return bench_serve_triton.run(args.reps, args.warmup, args.duration)
    results = bench(args.reps, args.warmup, args.duration)
    write(results, args.reps, args.warmup, args.duration)


if __name__ == "__main__":
    main()
