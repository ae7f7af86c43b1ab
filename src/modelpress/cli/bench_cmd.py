"""modelpress bench MODEL [--vs OTHER ...]: latency, throughput, FLOP/s against the machine's peak,
peak memory and a per-operator profile, models timed side by side (interleaved).

Measure latency (median and spread over interleaved runs), throughput, achieved FLOP/s and memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, err_console, human_count, print_notes
from modelpress.errors import OptionError
from modelpress.ir.feeds import load_npz
from modelpress.profile.bench import bench
from modelpress.runtime.ort import OPT_LEVELS


def add_parser(sub) -> None:

    p = options.add_command(
        sub,
        "bench",
        __doc__,
        help="measure latency, throughput and memory; compare models side by side",
        examples=[
            "modelpress bench model.onnx --vs fast.onnx --dim batch=8 --runs 100 --profile-ops",
            "modelpress bench model.onnx --vs fast.onnx,int8.onnx --ort-level disabled",
        ],
    )
    options.add_model(p)
    options.add_key(p)
    options.add_list(p, "--vs", metavar="MODEL", help="other models to time in the same runs")
    options.add_device(p)
    p.add_argument(
        "--threads", type=int, metavar="N", help="intra-op threads (default: the runtime's choice)"
    )
    p.add_argument(
        "--ort-level",
        default="all",
        choices=list(OPT_LEVELS),
        help="ONNX Runtime's own graph optimization level (ort backend; default all)",
    )
    p.add_argument("--optimize", dest="old_optimize", help=argparse.SUPPRESS)  # now --ort-level
    options.add_inputs(p, to="to time on")
    options.add_with_default(
        p, "--runs", type=int, default=50, metavar="N", help="timed runs per model"
    )
    options.add_with_default(
        p, "--warmup", type=int, default=5, metavar="N", help="untimed runs first"
    )
    options.add_switch(p, "--profile-ops", "per-operator time from the runtime's profiler (ort)")
    options.add_record(p)
    options.add_report(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:

    if args.old_optimize is not None:
        raise OptionError(
            "bench --optimize is now --ort-level (ONNX Runtime's level); --optimize means modelpress's optimizer"
        )
    record = options.Recorder("bench", args)
    paths = [args.model, *options.listed(args.vs)]
    models = [options.open_model(p, args) for p in paths]
    with console.status("timing…") as status:
        result = bench(
            models,
            names=paths,
            data=load_npz(args.data) if args.data else None,
            dims=options.dims(args),
            shapes=options.shapes(args),
            **options.placement(args),
            **options.keywords(args, "threads", "ort_level", "runs", "warmup", "profile_ops"),
            progress=lambda msg: status.update(f"{msg}…"),
        )
    print_notes(result.notes, to=err_console)
    for m in result.models:
        for w in m.warnings:
            err_console.print(f"warning: {escape(m.name)}: {escape(w)}")
        if args.log_placement:
            for line in m.placement:
                console.print(f"{escape(m.name)}: {escape(line)}")
    shapes = ", ".join(f"{k} {v}" for k, v in result.shapes.items())
    t = Table(
        title=f"{args.backend} on {result.device}, batch {result.batch}, {result.runs} interleaved runs ({escape(shapes)})",
        show_edge=False,
    )
    for col in (
        "model",
        "median ms",
        "p25–p75 ms",
        "vs first",
        "samples/s",
        "GFLOP/s",
        "% peak",
        "MiB",
    ):
        t.add_column(col, justify="left" if col == "model" else "right")
    for m in result.models:
        t.add_row(
            escape(Path(m.name).name),
            f"{m.timing.median_ms:.3f}",
            f"{m.timing.p25_ms:.3f}–{m.timing.p75_ms:.3f}",
            f"{m.ratio_vs_first:.2f}×",
            f"{m.samples_per_s:.1f}",
            f"{m.gflops:.2f}",
            f"{100 * m.gflops / result.machine_peak_gflops:.1f}%",
            "?" if m.peak_memory_mb is None else f"{m.peak_memory_mb:.1f}",
        )
    console.print(t)
    console.print(
        f"machine peak (fp32 MatMul under ONNX Runtime): {result.machine_peak_gflops:.1f} GFLOP/s"
    )
    for m in result.models:
        if m.operators is None:
            continue
        total = sum(ms for _, ms, _ in m.operators) or 1.0
        pt = Table(title=f"top operators: {escape(m.name)}", show_edge=False)
        for col in ("op", "total ms", "share", "calls"):
            pt.add_column(col, justify="left" if col == "op" else "right")
        for op, ms, n in m.operators[:10]:
            pt.add_row(op, f"{ms:.2f}", f"{100 * ms / total:.0f}%", human_count(n))
        console.print(pt)
    record.write(result.to_dict(), models={Path(p).name: m for p, m in zip(paths, models)})
    return 0
