"""What ``modelpress advise`` writes: the ranking, the service plan and the catalog on the console,
and the workload's summary in the record."""

from __future__ import annotations

from modelpress.cli._common import console, human_count
from modelpress.report.advisor_page import service_table


def workload_record(w) -> dict:
    return {
        "name": w.name,
        "params": w.params,
        "sample": w.sample,
        "unit": w.unit,
        "flops_per_sample": w.flops_per_sample,
        "kernels": len(w.kernels),
        "notes": list(w.notes),
    }


def money(v) -> str:
    return "-" if v is None else f"${v:.3g}"


def print_ranking(rec, workload, calibration) -> None:
    from rich.table import Table

    req = rec.request
    console.print(
        f"[bold]{workload.name}[/]: {human_count(workload.params)} parameters, {human_count(workload.flops_per_sample)} FLOPs "
        f"per {workload.sample}; scenario [bold]{rec.scenario}[/] ({req.task}, {req.precision}"
        + (f", {req.num_gpus} devices" if req.num_gpus > 1 else "")
        + ")"
    )
    unit = next((r.estimate.unit for r in rec.rows if r.estimate), "samples/s")
    t = Table(show_edge=False)
    cols = ["#", "gpu", "fits", "mem GB", "batch", unit, "lat ms", "bound", "$/M cloud", "$/M own"]
    if req.amount:
        cols += ["job h", "job $"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("gpu", "bound") else "right")
    for r in rec.rows:
        e, c = r.estimate, r.cost
        row = [
            str(r.rank) if r.rank else "-",
            r.gpu.name.replace("NVIDIA ", "").replace("GeForce ", ""),
            "-" if e is None else ("yes" if e.fits else "no"),
            "-" if e is None else f"{e.memory_gb:.1f}",
            "-" if e is None else str(e.batch),
            "-"
            if e is None
            else f"{e.throughput:,.0f}"
            if e.throughput >= 100
            else f"{e.throughput:.3g}",
            "-" if e is None else f"{e.latency_ms:.3g}",
            "-" if e is None else e.bound,
            money(c.cloud_usd_per_million if c else None),
            money(c.own_usd_per_million if c else None),
        ]
        if req.amount:
            row += [
                "-" if not c or c.job_hours is None else f"{c.job_hours:.3g}",
                money(c.best_job_usd if c else None),
            ]
        t.add_row(*row)
    console.print(t)
    for r in rec.rows:
        console.print(f"  {r.rank or '-'}. {r.gpu.name}: {r.reason}", soft_wrap=True)
    if calibration:
        c = calibration
        console.print(
            f"calibration on {c.cpu} ({c.threads} threads): matmul {c.matmul_gflops:.1f} GFLOP/s, copy {c.copy_gbs:.1f} GB/s, "
            f"{c.node_overhead_us:.2f} µs per node; "
            + (
                f"model at batch {c.batch}: predicted {c.predicted_ms:.3g} ms, measured {c.measured_ms:.3g} ms "
                f"(p25-p75 {c.measured_p25_ms:.3g}-{c.measured_p75_ms:.3g}), ratio {c.ratio:.2f}"
                if c.measured_ms is not None
                else f"model predicted {c.predicted_ms:.3g} ms at batch {c.batch} (give an .onnx file to time it)"
            )
        )


def print_plan(plan, workload, model_path) -> None:
    from rich.table import Table

    console.print(
        f"[bold]{workload.name}[/]: {plan.qps:g} requests/s at p99 {plan.p99_ms:g} ms ({plan.precision}); "
        "each replica batches dynamically: it takes what waited while it was busy, up to --max-batch, "
        "waiting at most --max-delay-ms for company"
    )
    t = Table(show_edge=False)
    columns, rows = service_table(plan)
    for c in columns:
        t.add_column(c, justify="left" if c == "device" else "right")
    for row in rows:
        row[1] = row[1].replace("NVIDIA ", "").replace("GeForce ", "")
        row[-2:] = [money(None if v == "-" else v) for v in row[-2:]]
        t.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    console.print(t)
    best = plan.options[0]
    console.print(
        f"cheapest: {best.replicas} x {best.device}, each serving with "
        f"`modelpress serve {model_path or 'MODEL'} {best.serve_args}` "
        f"(batches of {best.queue.mean_batch:.3g} on average, p99 {best.queue.p99_ms:.3g} ms)",
        soft_wrap=True,
    )
    for o in plan.options:
        if o.kind == "cpu":  # GPU notes (loose names) were printed above
            for note in o.notes:
                console.print(f"  {o.device}: {note}", soft_wrap=True)
    for device, reason in plan.rejected:
        console.print(f"  - {device}: {reason}", soft_wrap=True)
    sources = sorted({o.curve.source for o in plan.options})
    console.print(
        "service times: " + "; ".join(sources) + ". Latency is device time plus queueing; network "
        "and request decoding are not included.",
        soft_wrap=True,
    )


def print_catalog(catalog) -> None:
    from rich.table import Table

    t = Table(show_edge=False, title="accelerator catalog (dense peaks)")
    for c in (
        "name",
        "mem GB",
        "GB/s",
        "fp32",
        "tf32",
        "fp16",
        "bf16",
        "fp8",
        "int8",
        "TDP W",
        "price $",
        "cloud $/h",
    ):
        t.add_column(c, justify="left" if c == "name" else "right", no_wrap=c == "name")

    def f(v):
        return "-" if v is None else f"{v:g}"

    for g in catalog.gpus:
        t.add_row(
            g.name,
            f(g.memory_gb),
            f(g.memory_bandwidth_gbs),
            f(g.fp32_tflops),
            f(g.tf32_tflops),
            f(g.fp16_tflops),
            f(g.bf16_tflops),
            f(g.fp8_tflops),
            f(g.int8_tops),
            f(g.tdp_w),
            f(g.price_usd),
            f(g.cloud_usd_hr),
        )
    console.print(t)
