"""modelpress advise: which accelerator runs a workload, how fast, at what cost; with ``--qps``,
how many of each serve that traffic at a tail latency.

Estimate, for each accelerator in the catalog (or those named with --gpu), whether a workload fits,
its throughput and latency (roofline per kernel with fitted efficiency factors) and what it costs
to rent or own; rank them for the scenario asked: training, online inference (--latency-ms), batch
inference, or edge (--power-cap-w). With --qps and --p99-ms, plan a service instead: the replicas
of each GPU (and of this machine's CPU, measured) that serve the traffic with dynamic batching at
that tail latency, the batches they form, the serve settings to use and the cost per million
requests.
"""

from __future__ import annotations

from pathlib import Path

from modelpress.advisor.calibrate import calibrate_cpu
from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.cost import Pricing
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY
from modelpress.advisor.measured import measure_curve, record_curve, this_machine
from modelpress.advisor.recommend import Request, recommend
from modelpress.advisor.service import plan_service
from modelpress.cli import options
from modelpress.cli._common import console, human_count
from modelpress.cli.options import (
    Recorder,
    add_list,
    add_model,
    add_record,
    add_report,
    add_shapes,
    dims,
    listed,
    open_model,
    shapes,
)
from modelpress.errors import OptionError
from modelpress.ir.llm import is_llm_folder, read_config
from modelpress.profile.llm import llm_workload, load_config
from modelpress.profile.training import OPTIMIZER_STATES, PRECISION_BYTES
from modelpress.profile.workload import workload_from_onnx
from modelpress.profile.workloads import WORKLOADS, get_workload
from modelpress.report.advisor_page import (
    service_table,
    write_recommendation_page,
    write_service_page,
)
from modelpress.report.cards import costs_data, roofline_of_workload


def add_parser(sub) -> None:

    p = options.add_command(
        sub,
        "advise",
        __doc__,
        help="rank accelerators for a model, or plan a service: how many of each GPU serve --qps at --p99-ms",
        examples=[
            "modelpress advise model.onnx --qps 2000 --p99-ms 50",
            "modelpress advise --workload bert-base --precision int8 --qps 500 --p99-ms 20 --gpu L4,T4,A10",
            "modelpress advise --workload resnet50 --task infer --precision int8 --latency-ms 5",
            "modelpress advise --workload bert-large --precision int8 --batch-size 256 --avg-seq 170 --gpu L4  # padding-free",
            "modelpress advise --workload llama-2-7b --task infer --precision fp16 --batch-size 16 --seq 1024 --gpu h100-sxm,a100-sxm-80gb",
            "modelpress advise model.onnx --task train --precision fp16 --batch-size 64 --num-gpus 8 --json out.json --html out.html",
            "modelpress advise config.json --task infer --precision bf16 --gpu L4 --calibrate",
        ],
    )
    add_model(
        p,
        required=False,
        help="an .onnx model, a Hugging Face config.json of a decoder LLM, or an LLM folder "
        "(measured here: prefill of --seq tokens and decode, beside the CPU estimate)",
    )
    p.add_argument(
        "--workload", choices=list(WORKLOADS), help="a built-in workload instead of a file"
    )
    options.add_with_default(
        p,
        "--task",
        choices=("train", "infer", "training", "inference"),
        default="infer",
        help="training step or inference",
    )
    p.add_argument(
        "--precision",
        choices=list(PRECISION_BYTES),
        default="fp16",
        help="compute precision (default fp16; training below 32 bits is mixed precision)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="batch per device (default: the largest that fits, at most 256, or that meets --latency-ms)",
    )
    p.add_argument(
        "--seq", type=int, help="sequence length for transformers (prompt length for LLM inference)"
    )
    p.add_argument(
        "--avg-seq",
        type=float,
        metavar="L",
        help=(
            "mean real sequence length for padding-free encoder inference (bert-base, bert-large; "
            "varlen kernels skip the padding, as TensorRT varseqlen and MLPerf BERT do); "
            "throughput stays in sequences/s (default: every sequence padded to --seq)"
        ),
    )
    options.add_with_default(
        p,
        "--gen-tokens",
        type=int,
        default=128,
        help="tokens generated per request by decoder LLMs",
    )
    add_list(
        p,
        "--gpu",
        metavar="NAME",
        help="candidate devices, loose names (default: the whole catalog)",
    )
    options.add_with_default(
        p,
        "--num-gpus",
        type=int,
        default=1,
        help="devices per candidate: data parallel for training, replicas or tensor parallel for inference",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        help="online inference latency target (per generated token for LLMs)",
    )
    p.add_argument(
        "--power-cap-w",
        type=float,
        help="edge scenario: only devices whose TDP is within this many watts",
    )
    options.add_with_default(
        p, "--optimizer", choices=list(OPTIMIZER_STATES), default="adam", help="training optimizer"
    )
    p.add_argument(
        "--samples",
        type=float,
        help="samples (tokens for LLMs) to process: adds the job's time and cost",
    )
    p.add_argument(
        "--catalog",
        action="append",
        metavar="FILE",
        help="CSV or JSON file adding or overriding catalog entries (repeatable)",
    )
    options.add_with_default(
        p,
        "--life-years",
        type=float,
        default=3.0,
        help="owned hardware: years to amortise the price over",
    )
    options.add_with_default(
        p, "--electricity", type=float, default=0.15, help="owned hardware: USD per kWh"
    )
    options.add_with_default(
        p,
        "--utilization",
        type=float,
        default=0.6,
        help="owned hardware: fraction of the time busy",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this CPU (matmul, memory copy, the .onnx model under ONNX Runtime) against the prediction",
    )
    s = p.add_argument_group("service planning (with --qps)")
    s.add_argument("--qps", type=float, help="requests per second the service must handle")
    s.add_argument("--p99-ms", type=float, help="99th-percentile latency target per request, ms")
    s.add_argument(
        "--max-batch",
        type=int,
        metavar="N",
        help="cap on the batch a replica takes (default: planned)",
    )
    s.add_argument(
        "--max-delay-ms",
        type=float,
        metavar="D",
        help="fix how long a batch waits for more requests (default: planned)",
    )
    options.add_with_default(
        s,
        "--engine",
        choices=("compiled", "eager"),
        default="compiled",
        help="how the GPUs run the model: a compiled engine (TensorRT, ONNX Runtime) or eager PyTorch",
    )
    s.add_argument(
        "--no-cpu", action="store_true", help="do not measure the .onnx model on this machine's CPU"
    )
    add_list(
        s,
        "--measured",
        metavar="FILE",
        help="`modelpress bench --json` records of the model on the CPU option, instead of measuring it",
    )
    s.add_argument(
        "--cpu-usd-hr",
        type=float,
        help="rent of this machine per hour (default: its vCPUs at a cloud price)",
    )
    s.add_argument("--cpu-own-usd-hr", type=float, help="cost of owning this machine per hour")
    s.add_argument(
        "--check",
        action="store_true",
        help="plan with the server's own cost measured here, then serve the .onnx model as planned "
        "on this CPU, drive it open-loop at the planned rate and put the measured p99 beside the promise",
    )
    add_shapes(p)
    p.add_argument("--list-gpus", action="store_true", help="print the catalog and exit")
    add_record(p)
    add_report(p)
    p.add_argument("--html", metavar="FILE", help="write an HTML page with the ranking and plots")
    p.set_defaults(func=run)


def _workload(args):

    if bool(args.model) == bool(args.workload):
        raise OptionError("give either a model file (.onnx or config.json) or --workload NAME")
    if args.workload:
        return get_workload(
            args.workload,
            seq=args.seq,
            gen_tokens=args.gen_tokens if args.task == "infer" else 0,
            avg_seq=args.avg_seq,
        ), None
    if args.avg_seq is not None:
        raise OptionError(
            "--avg-seq: applies to the built-in encoder workloads (--workload bert-*)"
        )
    path = Path(args.model)
    if path.suffix.lower() == ".json":
        cfg = load_config(path)
        seq = args.seq or min(1024, cfg.context // 2)
        return llm_workload(
            cfg, seq=seq, gen_tokens=args.gen_tokens if args.task == "infer" else 0
        ), None
    if path.suffix.lower() == ".onnx":
        model = open_model(path, args)
        return workload_from_onnx(
            model, name=path.stem, seq=args.seq, dims=dims(args), shapes=shapes(args)
        ), model
    raise OptionError(f"{path}: expected an .onnx model or a config.json")


def run(args) -> int:

    recorder = Recorder("advise", args)
    args.task = {"training": "train", "inference": "infer"}.get(args.task, args.task)
    catalog = load_catalog(args.catalog)
    if args.list_gpus:
        _print_catalog(catalog)
        return 0
    for name, value in (
        ("--batch-size", args.batch_size),
        ("--seq", args.seq),
        ("--num-gpus", args.num_gpus),
        ("--max-batch", args.max_batch),
    ):
        if value is not None and value < 1:
            raise OptionError(f"{name} must be at least 1")
    if (args.qps is None) != (args.p99_ms is None):
        raise OptionError("service planning needs both --qps and --p99-ms")
    if args.model and is_llm_folder(args.model):
        return _advise_llm(args, recorder)
    workload, model = _workload(args)
    found = [catalog.lookup(n) for n in dict.fromkeys(listed(args.gpu))]
    for f in found:
        if f.note:
            console.print(f"note: {f.note}", soft_wrap=True)
    candidates = [f.gpu for f in found] or list(catalog.gpus)
    pricing = Pricing(
        life_years=args.life_years,
        electricity_usd_kwh=args.electricity,
        utilization=args.utilization,
    )
    if args.qps is not None:
        return _plan(args, recorder, workload, model, candidates, found, pricing)
    req = Request(
        task=args.task,
        precision=args.precision,
        batch=args.batch_size,
        num_gpus=args.num_gpus,
        latency_ms=args.latency_ms,
        power_cap_w=args.power_cap_w,
        amount=args.samples,
        optimizer=args.optimizer,
    )
    calibration = None
    if args.calibrate:
        with console.status("measuring this CPU"):
            calibration = calibrate_cpu(
                workload, model=model, batch=args.batch_size or 1, seq=args.seq
            )
    rec = recommend(workload, candidates, req, eff=DEFAULT_EFFICIENCY, pricing=pricing)
    _print(rec, workload, calibration)
    recorder.write(
        {
            "workload": _workload_dict(workload),
            "scenario": rec.scenario,
            "request": dict(req.__dict__),
            "pricing": dict(pricing.__dict__),
            "efficiency": DEFAULT_EFFICIENCY.to_dict(),
            "devices": [r.to_dict() for r in rec.rows],
            "gpu_notes": [f.note for f in found if f.note],
            "calibration": calibration.to_dict() if calibration else None,
        },
        models={"model": model} if model is not None else None,
        charts=_charts(rec, workload) if recorder.wanted else None,
    )
    if args.html:
        write_recommendation_page(args.html, rec, workload, calibration)
    return 0


def _advise_llm(args, recorder) -> int:
    """An LLM folder: prefill and decode measured on this CPU beside the estimate of its graph."""
    from modelpress.advisor.llm_measured import calibrate_llm

    prompt = args.seq or 256
    tokens = min(args.gen_tokens, 32)
    context = read_config(args.model).max_context
    if prompt + tokens > context:
        raise OptionError(
            f"--seq {prompt} + {tokens} generated tokens is over the model's context of {context}"
        )
    with console.status(f"measuring {args.model} on this CPU"):
        cal = calibrate_llm(args.model, prompt_tokens=prompt, gen_tokens=tokens)
    console.print(
        f"{args.model} on {cal.cpu} ({cal.threads} threads): matmul {cal.matmul_gflops:.1f} "
        f"GFLOP/s, copy {cal.copy_gbs:.1f} GB/s, {cal.node_overhead_us:.2f} µs a node"
    )
    rows = [
        (
            f"prefill, {prompt} tokens",
            cal.prefill_ms,
            cal.prefill_range_ms,
            cal.predicted_prefill_ms,
            cal.prefill_bound,
        ),
        (
            f"decode, a token ({cal.decode_tokens_per_s:.1f}/s)",
            cal.decode_ms,
            cal.decode_range_ms,
            cal.predicted_decode_ms,
            cal.decode_bound,
        ),
    ]
    console.print(f"{'':28} {'measured ms':>20} {'estimate ms':>11} {'est/meas':>9}")
    for name, ms, (lo, hi), est, bound in rows:
        spread = f"({lo:.0f}-{hi:.0f})"
        console.print(f"{name:28} {ms:>9.1f} {spread:>10} {est:>11.1f} {est / ms:>9.2f}  {bound}")
    console.print(
        f"median of {cal.runs} runs, {tokens} greedy tokens each; the estimate is the decoder "
        "graph's roofline on the roof measured above. For GPUs, give the checkpoint's config.json."
    )
    recorder.write({"llm": cal.to_dict()})
    return 0


def _charts(rec, workload) -> dict:
    """The record's charts (``--report``, ``--json``): the advisor's costs and the roofline on
    the device ranked first."""

    charts = {"costs": costs_data(rec)}
    if rec.ranked:
        best = rec.ranked[0]
        charts["roofline"] = roofline_of_workload(
            workload, best.gpu, precision=rec.request.precision, batch=best.estimate.batch
        )
    return charts


def _plan(args, recorder, workload, model, candidates, found, pricing) -> int:
    """``--qps``/``--p99-ms``: plan the service on every candidate and this machine's CPU."""

    if args.task != "infer":
        raise OptionError("--qps plans an inference service: drop --task train")
    if args.check:
        return _checked(args, recorder, workload, model, candidates, found)
    machine = None
    measured = listed(args.measured)
    if measured:
        machine = this_machine(
            record_curve(measured), cloud_usd_hr=args.cpu_usd_hr, own_usd_hr=args.cpu_own_usd_hr
        )
    elif model is not None and not args.no_cpu:
        with console.status("measuring the model on this CPU (ONNX Runtime)"):
            curve = measure_curve(
                model,
                target_s=args.p99_ms / 1e3,
                dims=dims(args),
                shapes=shapes(args),
                limit=args.max_batch or 256,
            )
        machine = this_machine(curve, cloud_usd_hr=args.cpu_usd_hr, own_usd_hr=args.cpu_own_usd_hr)
    with console.status(f"planning {len(candidates)} devices"):
        plan = plan_service(
            workload,
            candidates,
            qps=args.qps,
            p99_ms=args.p99_ms,
            precision=args.precision,
            machine=machine,
            eff=DEFAULT_EFFICIENCY,
            pricing=pricing,
            max_batch=args.max_batch,
            max_delay_ms=args.max_delay_ms,
            engine=args.engine,
            gpu_notes={f.gpu.name: f.note for f in found if f.note},
        )
    _print_plan(plan, workload, args.model)
    recorder.write({"workload": _workload_dict(workload), "service": plan.to_dict()})
    if args.html:
        write_service_page(args.html, plan, workload)
    return 0


def _checked(args, recorder, workload, model, candidates, found) -> int:
    """``--check``: the plan with the server's measured cost, and this CPU's option measured."""
    from modelpress.deploy.checked import checked_plan

    if model is None:
        raise OptionError("--check serves the model: give an .onnx file")
    with console.status("measuring the server and the model here, planning, then checking"):
        got = checked_plan(
            model,
            name=workload.name,
            qps=args.qps,
            p99_ms=args.p99_ms,
            plan_options={
                "gpus": [f.gpu for f in found],
                "cpu": not args.no_cpu,
                "precision": args.precision,
                "max_batch": args.max_batch,
            },
        )
    _print_plan(got.plan, workload, args.model)
    c = got.check
    if c is not None:
        console.print(
            f"check on this CPU ({c.rate:.4g} requests/s to one replica, open loop): measured p99 "
            f"{c.load.p99_ms:.3g} ms, {c.load.throughput:.4g} answered/s; "
            + ("[red]missed[/]: " if c.missed else "[green]held[/]: ")
            + c.reason,
            soft_wrap=True,
        )
    recorder.write({"workload": _workload_dict(workload), **got.to_dict()})
    return 0


def _workload_dict(w) -> dict:
    return {
        "name": w.name,
        "params": w.params,
        "sample": w.sample,
        "unit": w.unit,
        "flops_per_sample": w.flops_per_sample,
        "kernels": len(w.kernels),
        "notes": list(w.notes),
    }


def _money(v) -> str:
    return "-" if v is None else f"${v:.3g}"


def _print(rec, workload, calibration) -> None:
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
            _money(c.cloud_usd_per_million if c else None),
            _money(c.own_usd_per_million if c else None),
        ]
        if req.amount:
            row += [
                "-" if not c or c.job_hours is None else f"{c.job_hours:.3g}",
                _money(c.best_job_usd if c else None),
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


def _print_plan(plan, workload, model_path) -> None:
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
        row[-2:] = [_money(None if v == "-" else v) for v in row[-2:]]
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


def _print_catalog(catalog) -> None:
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
