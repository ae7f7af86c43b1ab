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
from modelpress.advisor.estimate import ENGINES, TASKS
from modelpress.advisor.recommend import Request, recommend
from modelpress.cli import options
from modelpress.cli._advise_llm import advise_llm
from modelpress.cli._advise_output import print_catalog, print_ranking, workload_record
from modelpress.cli._advise_service import advise_service
from modelpress.cli._common import console
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
from modelpress.ir.llm import is_llm_folder
from modelpress.profile.llm import llm_workload, load_config
from modelpress.profile.training import OPTIMIZER_STATES, PRECISION_BYTES
from modelpress.profile.workload import workload_from_onnx
from modelpress.profile.workloads import WORKLOADS, get_workload
from modelpress.report.advisor_page import (
    write_recommendation_page,
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
        choices=(*TASKS, "training", "inference"),
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
        choices=ENGINES,
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
        print_catalog(catalog)
        return 0
    for flag, value in (
        ("--batch-size", args.batch_size),
        ("--seq", args.seq),
        ("--num-gpus", args.num_gpus),
        ("--max-batch", args.max_batch),
    ):
        options.require_positive(value, flag)
    if (args.qps is None) != (args.p99_ms is None):
        raise OptionError("service planning needs both --qps and --p99-ms")
    if args.model and is_llm_folder(args.model):
        return advise_llm(args, recorder)
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
        return advise_service(args, recorder, workload, model, candidates, found, pricing)
    req = Request(
        batch=args.batch_size,
        amount=args.samples,
        **options.keywords(
            args,
            "task",
            "precision",
            "num_gpus",
            "latency_ms",
            "power_cap_w",
            "optimizer",
            "engine",
        ),
    )
    calibration = None
    if args.calibrate:
        with console.status("measuring this CPU"):
            calibration = calibrate_cpu(
                workload, model=model, batch=args.batch_size or 1, seq=args.seq
            )
    rec = recommend(workload, candidates, req, eff=DEFAULT_EFFICIENCY, pricing=pricing)
    print_ranking(rec, workload, calibration)
    recorder.write(
        {
            "workload": workload_record(workload),
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
