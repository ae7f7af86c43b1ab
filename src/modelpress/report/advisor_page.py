"""The pages of ``modelpress advise --html``: a device ranking (``recommend``) and a service plan
(``plan_service``), with their charts."""

from __future__ import annotations

from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY
from modelpress.report.advisor_plots import roofline, throughput_vs_cost
from modelpress.report.html import Page


def service_table(plan) -> tuple[list[str], list[list]]:
    """The columns and rows of a service plan's options, ranked: the one table of ``advise
    --qps``, on the page and in the terminal."""
    columns = [
        "#",
        "device",
        "replicas",
        "max batch",
        "delay ms",
        "mean batch",
        "p50 ms",
        "p99 ms",
        "busy",
        "$/M cloud",
        "$/M own",
    ]
    rows = [
        [
            o.rank,
            o.device,
            o.replicas,
            o.max_batch,
            float(o.max_delay_ms),
            float(o.queue.mean_batch),
            float(o.queue.p50_ms),
            float(o.queue.p99_ms),
            f"{100 * o.queue.utilisation:.0f}%",
            "-" if o.cloud_usd_per_million is None else float(o.cloud_usd_per_million),
            "-" if o.own_usd_per_million is None else float(o.own_usd_per_million),
        ]
        for o in plan.options
    ]
    return columns, rows


def write_service_page(path, plan, workload) -> None:
    """``advise --qps``'s page: the traffic, the options ranked, the devices refused."""
    page = Page(f"modelpress advise: serving {workload.name}")
    s = page.section("Traffic")
    s.text(
        f"{plan.qps:g} requests per second, p99 latency target {plan.p99_ms:g} ms, precision {plan.precision}. "
        "Each replica batches dynamically (up to max batch, waiting at most the max delay); the batch sizes "
        "and latencies come from a queueing analysis of that policy at the replica's share of the traffic."
    )
    s = page.section("Options")
    columns, rows = service_table(plan)
    s.table(
        [*columns, "serve"],
        [[*row, o.serve_args] for row, o in zip(rows, plan.options, strict=True)],
    )
    if plan.rejected:
        s.table(["device", "why not"], [list(r) for r in plan.rejected])
    s.text(
        "Service times: "
        + "; ".join(sorted({o.curve.source for o in plan.options}))
        + ". Prices are defaults, not quotes.",
        note=True,
    )
    page.write(path)


def write_recommendation_page(path, rec, workload, calibration=None) -> None:
    """``advise``'s page: the request, the ranking, throughput against cost, the roofline on the
    device ranked first, the CPU calibration when there is one, and the sources of the numbers."""
    req = rec.request
    page = Page(f"modelpress advise: {workload.name}")
    s = page.section("Request")
    s.text(
        f"{workload.name}: {workload.params:,.0f} parameters, {workload.flops_per_sample:,.0f} FLOPs per {workload.sample}. "
        f"Scenario {rec.scenario}: {req.task}, {req.precision}, {req.num_gpus} device(s) per candidate"
        + (f", latency target {req.latency_ms:g} ms" if req.latency_ms else "")
        + (f", power cap {req.power_cap_w:g} W" if req.power_cap_w else "")
        + "."
    )
    s = page.section("Ranking")
    rows = []
    for r in rec.rows:
        e, c = r.estimate, r.cost
        rows.append(
            [
                r.rank or "-",
                r.gpu.name,
                "-" if e is None else ("yes" if e.fits else "no"),
                "-" if e is None else round(e.memory_gb, 2),
                "-" if e is None else e.batch,
                "-" if e is None else float(e.throughput),
                "-" if e is None else float(e.latency_ms),
                "-" if e is None else e.bound,
                "-" if not c or c.cloud_usd_per_million is None else float(c.cloud_usd_per_million),
                "-" if not c or c.own_usd_per_million is None else float(c.own_usd_per_million),
                r.reason,
            ]
        )
    unit = rec.ranked[0].estimate.unit if rec.ranked else ""
    s.table(
        [
            "#",
            "gpu",
            "fits",
            "memory GB",
            "batch",
            f"throughput ({unit})",
            "latency ms",
            "bound",
            "$/M cloud",
            "$/M own",
            "reason",
        ],
        rows,
    )
    s = page.section("Throughput against cost")
    s.figure(throughput_vs_cost(rec))
    best = rec.ranked[0]
    s = page.section(f"Roofline on {best.gpu.name}")
    s.figure(
        roofline(workload, best.gpu, precision=req.precision, batch=best.estimate.batch),
        caption="each point is a kernel of the forward pass (decode step for LLMs) at its predicted speed",
    )
    if calibration:
        s = page.section("Calibration on this CPU")
        s.table(
            [
                "cpu",
                "matmul GFLOP/s",
                "copy GB/s",
                "µs per node",
                "batch",
                "predicted ms",
                "measured ms",
                "ratio",
            ],
            [
                [
                    calibration.cpu,
                    calibration.matmul_gflops,
                    calibration.copy_gbs,
                    calibration.node_overhead_us,
                    calibration.batch,
                    calibration.predicted_ms or "-",
                    calibration.measured_ms or "-",
                    calibration.ratio or "-",
                ]
            ],
        )
    s = page.section("Model and sources")
    s.table(
        ["efficiency factor", "value"],
        [[k, float(v)] for k, v in DEFAULT_EFFICIENCY.to_dict().items()],
    )
    s.table(
        ["gpu", "number", "source"],
        [
            [r.gpu.name, k, r.gpu.source(k)]
            for r in rec.ranked[:5]
            for k in (
                "memory_bandwidth_gbs",
                f"{req.precision}_tflops" if req.precision != "int8" else "int8_tops",
                "price_usd",
                "cloud_usd_hr",
            )
            if getattr(r.gpu, k, None) is not None
        ],
    )
    s.text(
        "Estimates are rooflines with fitted efficiency factors (see benchmarks/results/advisor.md); prices are defaults, not quotes.",
        note=True,
    )
    page.write(path)
