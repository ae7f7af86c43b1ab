"""modelpress bench MODEL [--vs OTHER ...]: latency, throughput, FLOP/s against the machine's peak,
peak memory and a per-operator profile, models timed side by side (interleaved)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from modelpress.cli._common import console, err_console, human_count, write_json
from modelpress.cli.options import Recorder, add_report


def add_parser(sub) -> None:
    from modelpress.runtime.backend import backend_names

    p = sub.add_parser(
        "bench",
        help="measure latency, throughput and memory; compare models side by side",
        description="Measure latency (median and spread over interleaved runs), throughput, achieved FLOP/s and memory.",
        epilog="example: modelpress bench model.onnx --vs fast.onnx --dim batch=8 --runs 100 --profile-ops",
    )
    p.add_argument("model", help="an .onnx file")
    p.add_argument("--vs", nargs="+", default=[], metavar="MODEL", help="other models to time in the same runs")
    p.add_argument("--backend", default="ort", choices=backend_names())
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="intra-op threads (default: the runtime's choice)")
    p.add_argument("--optimize", default="all", choices=["disabled", "basic", "extended", "all"], help="ONNX Runtime graph optimization level (ort backend)")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE", help="size of a named dynamic dimension (repeatable)")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs to use instead of generated ones")
    p.add_argument("--runs", type=int, default=50, help="timed runs per model (default 50)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-ops", action="store_true", help="per-operator time from the runtime's profiler (ort)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    add_report(p)
    p.set_defaults(func=run)


def _backend(args, profile: bool):
    if args.backend == "ort":
        from modelpress.runtime.ort_backend import OrtBackend, OrtOptions

        return OrtBackend(OrtOptions(intra_op_threads=args.threads, optimize=args.optimize, profile=profile))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return args.backend


def run(args) -> int:
    from modelpress.errors import OptionError
    from modelpress.ir import load
    from modelpress.ir.feeds import load_npz
    from modelpress.ir.shapes import parse_dims
    from modelpress.profile import profile_model
    from modelpress.runtime.measure import (
        machine_peak_gflops,
        op_profile,
        peak_memory_mb,
        time_interleaved,
    )
    from modelpress.runtime.session import Session
    from modelpress.verify import generate_inputs

    if args.runs < 1:
        raise OptionError("--runs must be at least 1")
    recorder = Recorder("bench", args)
    paths = [args.model, *args.vs]
    models = [load(p) for p in paths]
    feeds = load_npz(args.inputs) if args.inputs else generate_inputs(models[0], dims=parse_dims(args.dim))
    # The first session in a process pays for loading the runtime's libraries; pay it up front so
    # that the peak memory measured below belongs to each model.
    Session(models[0], backend=_backend(args, False), device=args.device).run(feeds)
    sessions = []
    memory = []
    for path, model in zip(paths, models):
        holder = {}

        def make(model=model, holder=holder):
            holder["s"] = Session(model, backend=_backend(args, False), device=args.device)
            holder["s"].run(feeds)

        memory.append(peak_memory_mb(make))
        for w in holder["s"].warnings:
            err_console.print(f"warning: {path}: {w}")
        sessions.append(holder["s"])
    with console.status("timing…") as status:
        timings = time_interleaved(
            [lambda s=s: s.run(feeds, check=False) for s in sessions],
            runs=args.runs,
            warmup=args.warmup,
            progress=lambda r, n: status.update(f"timing… round {r}/{n}"),
        )
        status.update("measuring the machine's peak…")
        peak = machine_peak_gflops()
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    batch = next((v.shape[0] for v in feeds.values() if v.ndim), 1)
    t = Table(title=f"{args.backend} on {sessions[0].device}, batch {batch}, {args.runs} interleaved runs", show_edge=False)
    for col in ("model", "median ms", "p25–p75 ms", "vs first", "samples/s", "GFLOP/s", "% peak", "MiB"):
        t.add_column(col, justify="left" if col == "model" else "right")
    records = []
    for path, model, timing, mem in zip(paths, models, timings, memory):
        flops = profile_model(model, shapes).flops
        gflops = flops / (timing.median_ms / 1e3) / 1e9
        ratio = timing.median_ms / timings[0].median_ms
        t.add_row(
            Path(path).name, f"{timing.median_ms:.3f}", f"{timing.p25_ms:.3f}–{timing.p75_ms:.3f}", f"{ratio:.2f}×",
            f"{batch / (timing.median_ms / 1e3):.1f}", f"{gflops:.2f}", f"{100 * gflops / peak:.1f}%",
            "?" if mem is None else f"{mem:.1f}",
        )
        records.append({"model": path, "timing": timing.to_dict(), "ratio_vs_first": ratio, "flops": flops, "gflops": gflops, "peak_memory_mb": mem})
    console.print(t)
    console.print(f"machine peak (fp32 MatMul under ONNX Runtime): {peak:.1f} GFLOP/s")
    if args.profile_ops:
        if args.backend != "ort":
            raise OptionError("--profile-ops needs the ort backend")
        for path, model in zip(paths, models):
            s = Session(model, backend=_backend(args, True), device=args.device)
            for _ in range(max(args.runs // 5, 3)):
                s.run(feeds, check=False)
            rows = op_profile(s._parts[0][1].end_profiling())
            total = sum(ms for _, ms, _ in rows) or 1.0
            pt = Table(title=f"top operators: {path}", show_edge=False)
            for col in ("op", "total ms", "share", "calls"):
                pt.add_column(col, justify="left" if col == "op" else "right")
            for op, ms, n in rows[:10]:
                pt.add_row(op, f"{ms:.2f}", f"{100 * ms / total:.0f}%", human_count(n))
            console.print(pt)
    data = {"backend": args.backend, "batch": batch, "machine_peak_gflops": peak, "models": records}
    if args.json:
        write_json(args.json, data)
    recorder.write_page(data, models={Path(p).name: m for p, m in zip(paths, models)})
    return 0
