"""``modelpress advise --qps``: plan a service on every candidate and this machine's CPU, or
(``--check``) plan with the server's measured cost and check the plan on this CPU."""

from __future__ import annotations

from modelpress.advisor.measured import measure_curve, record_curve, this_machine
from modelpress.advisor.service import plan_service
from modelpress.cli._advise_output import print_plan, workload_record
from modelpress.cli._common import console
from modelpress.cli.options import dims, keywords, listed, shapes
from modelpress.errors import OptionError
from modelpress.report.advisor_page import write_service_page


def advise_service(args, recorder, workload, model, candidates, found, pricing) -> int:
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
            machine=machine,
            pricing=pricing,
            gpu_notes={f.gpu.name: f.note for f in found if f.note},
            **keywords(args, "qps", "p99_ms", "precision", "max_batch", "max_delay_ms", "engine"),
        )
    print_plan(plan, workload, args.model)
    recorder.write({"workload": workload_record(workload), "service": plan.to_dict()})
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
    print_plan(got.plan, workload, args.model)
    c = got.check
    if c is not None:
        console.print(
            f"check on this CPU ({c.rate:.4g} requests/s to one replica, open loop): measured p99 "
            f"{c.load.p99_ms:.3g} ms, {c.load.throughput:.4g} answered/s; "
            + ("[red]missed[/]: " if c.missed else "[green]held[/]: ")
            + c.reason,
            soft_wrap=True,
        )
    recorder.write({"workload": workload_record(workload), **got.to_dict()})
    return 0
