"""modelpress serve beside Triton Inference Server: same model, same batching, same client.

``python benchmarks/bench_serve.py --triton`` runs it. Triton is the real ``tritonserver`` binary
that ``nvidia-pytriton==0.7.0`` ships, in its own environment (``benchmarks/_work/triton-venv``,
built on first use; it runs on the CPU with the interpreter's libpython on LD_LIBRARY_PATH): its
HTTP front end and dynamic batcher, and its Python backend handing each batch to ONNX Runtime in
the pytriton process (``triton_peer.py``; the wheel ships no ONNX Runtime backend). Both servers
take the same v2 binary requests from bench_serve's closed-loop client at concurrency 64,
interleaved over rounds; the page is ``benchmarks/results/serve_triton.md``.
"""

import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from bench_serve import (
    HERE,
    MODELS,
    RESULTS,
    WORK,
    _cpu,
    _free_port,
    _requests,
    _run_load,
    _start,
    _wait_ready,
)

TRITON_VENV = HERE / "_work" / "triton-venv"
TRITON_PACKAGES = ["nvidia-pytriton==0.7.0", "onnxruntime==1.23.2", "numpy<3"]
TRITON_CONCURRENCY = 64
LOAD: list[float] = []  # 1-minute load average at the start of each model and at the end


def _group_cpu_s(pgid: int) -> float:
    """User + system CPU time of every process in a process group (Triton's server, its Python
    backend's stubs and the pytriton process; modelpress is one process)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _triton_python() -> Path:
    """The Python of a separate environment holding nvidia-pytriton (its tritonserver binary)."""
    py = TRITON_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRITON_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *TRITON_PACKAGES], check=True)
    return py


def _start_triton(model: str, name: str, port: int) -> subprocess.Popen:
    import sysconfig

    # tritonserver's Python backend loads libpython: the interpreter's own library folder
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p
        ),
    )
    cmd = [str(_triton_python()), str(HERE / "triton_peer.py"), "--model", model, "--name", name]
    cmd += ["--port", str(port), "--max-batch", "32", "--delay-us", "2000"]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    _wait_ready(port, f"/v2/models/{name}/ready", proc, timeout=300)
    return proc


def bench_triton(reps: int, warmup: float, duration: float) -> dict:
    """modelpress serve (max batch 32, 2 ms) and Triton (the same dynamic batching) on the same
    model, the same v2 binary requests from the same closed-loop client at concurrency 64,
    interleaved over ``reps`` rounds."""
    from modelpress import zoo

    WORK.mkdir(parents=True, exist_ok=True)
    results = {}
    for zname, seq in MODELS.items():
        LOAD.append(os.getloadavg()[0])
        path = str(zoo.build(zname, WORK / f"{zname}.onnx"))
        entry = zoo.get(zname)
        sample = {k: np.ascontiguousarray(v) for k, v in entry.inputs(1, seq).items()}
        v2, _ = _requests(zname, sample)
        (WORK / f"{zname}.v2").write_bytes(v2)
        ports = {"modelpress": _free_port(), "triton": _free_port() + 10}
        procs = {}
        runs = {v: [] for v in ports}
        try:
            procs["modelpress"] = _start("modelpress", path, zname, ports["modelpress"], {})
            procs["triton"] = _start_triton(path, zname, ports["triton"])
            for v in ports:  # the first answers of each are slow (sessions, the batcher's threads)
                _run_load(ports[v], WORK / f"{zname}.v2", 4, 0.0, 1.0)
            for r in range(reps):
                for v in list(ports) if r % 2 == 0 else list(ports)[::-1]:
                    cpu0 = _group_cpu_s(procs[v].pid)
                    res = _run_load(
                        ports[v], WORK / f"{zname}.v2", TRITON_CONCURRENCY, warmup, duration
                    )
                    res["cpu_us"] = (_group_cpu_s(procs[v].pid) - cpu0) / max(res["total"], 1) * 1e6
                    runs[v].append(res)
                    print(
                        f"{zname} rep {r} {v:<11} {res['rps']:8.1f} req/s  p50 {res['p50_ms']:7.2f}  p99 {res['p99_ms']:7.2f}  CPU {res['cpu_us']:6.0f} us/req  errors {res['errors']}",
                        flush=True,
                    )
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        results[zname] = runs
    LOAD.append(os.getloadavg()[0])
    return results


def write_triton(results: dict, reps: int, warmup: float, duration: float) -> None:
    def cell(rs, key, fmt="{:.1f}"):
        values = [r[key] for r in rs]
        return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"

    lines = [
        "# serving beside Triton Inference Server",
        "",
        f"Machine: {_cpu()}, shared with other jobs (1-minute load average "
        f"{', '.join(f'{x:.1f}' for x in LOAD)} at the start of each model and at the end: on 2 "
        "cores, every process waits for CPU, so compare the two servers within this run only). "
        f"Python {platform.python_version()}. Date: {datetime.date.today()}. Command: "
        f"`python benchmarks/bench_serve.py --triton --reps {reps} --warmup {warmup:g} --duration {duration:g}`.",
        "",
        "Same model, same dynamic batching (max batch 32, 2 ms queue delay), the same v2 binary "
        f"requests from the same closed-loop client at concurrency {TRITON_CONCURRENCY}, "
        "interleaved over rounds; medians (min-max). Triton is `tritonserver` from "
        "`nvidia-pytriton==0.7.0` (CPU): its HTTP front end and dynamic batcher, and its Python "
        "backend handing each batch to ONNX Runtime in the pytriton process (the wheel ships no "
        "ONNX Runtime backend); `benchmarks/triton_peer.py`. Server CPU: the CPU time of the "
        "server's processes (Triton: tritonserver, its stubs and the pytriton process) per "
        "request, model included.",
        "",
        "| model | server | req/s | p50 ms | p99 ms | server CPU µs/request | errors | throughput ≥ Triton's, p99 ≤ Triton's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for zname, runs in results.items():
        mp, tr = runs["modelpress"], runs["triton"]
        med = {
            v: {k: statistics.median(r[k] for r in rs) for k in ("rps", "p99_ms")}
            for v, rs in runs.items()
        }
        verdict = (
            "yes"
            if med["modelpress"]["rps"] >= med["triton"]["rps"]
            and med["modelpress"]["p99_ms"] <= med["triton"]["p99_ms"]
            else "no"
        )
        for v, rs in (("modelpress serve", mp), ("Triton", tr)):
            lines.append(
                f"| {zname} | {v} | {cell(rs, 'rps')} | {cell(rs, 'p50_ms', '{:.2f}')} | "
                f"{cell(rs, 'p99_ms', '{:.2f}')} | {cell(rs, 'cpu_us', '{:.0f}')} | "
                f"{sum(r['errors'] for r in rs)} | " + (verdict if v == "Triton" else "") + " |"
            )
    lines += ["", "Within each round (the two servers back to back), modelpress / Triton:", ""]
    for zname, runs in results.items():
        pairs = list(zip(runs["modelpress"], runs["triton"]))
        rps = [m["rps"] / t["rps"] for m, t in pairs]
        p99 = [m["p99_ms"] / t["p99_ms"] for m, t in pairs]
        lines.append(
            f"- {zname}: throughput {statistics.median(rps):.2f}x ({min(rps):.2f}-{max(rps):.2f}), "
            f"p99 {statistics.median(p99):.2f}x ({min(p99):.2f}-{max(p99):.2f})"
        )
    lines += [
        "",
        "What the server's request path costs, and what changed it (issue 29): py-spy on "
        "`resnet-digits` at concurrency 64 showed the event loop, not the model, as the limit "
        "(the model's thread ran about a quarter of the time). FastAPI's middleware stack and router "
        "took a fifth of the loop's time per request; three uvloop timers a request (uvicorn's "
        "keep-alive wait, the header deadline, the body deadline) about 7 µs each; the "
        "largest-body limit, worked out with numpy on every request, 7%; JSON parsing of a "
        "header that is the same on every request, and writing an answer header that is too, "
        "about 25 µs. Now: the infer route runs in front of FastAPI (`serve/infer_route.py`), "
        "deadlines are kept by one sweep (`serve/connections.py`), repeated headers are read and "
        "written once (`serve/protocol.py`), gauges are read when scraped, and an answer's head "
        "and body go out in one write. Measured the same way before these changes "
        "(2026-11-29, 3 rounds): modelpress 869 req/s, p99 121 ms against Triton's 1345 req/s, "
        "p99 217 ms. The old and the new server side by side, interleaved over 4 rounds with "
        "this client (same day): 929 -> 1681 req/s, p99 117 -> 70 ms, server CPU 333 -> 171 "
        "µs/request.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve_triton.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "serve_triton.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS / 'serve_triton.md'}")


def run(reps: int, warmup: float, duration: float) -> None:
    write_triton(bench_triton(reps, warmup, duration), reps, warmup, duration)
