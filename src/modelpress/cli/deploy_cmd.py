"""modelpress deploy MODEL -o DEPLOY_DIR --qps N --p99-ms M: search, protect, plan, write a folder
that platforms run, and check the plan against the real server.

Search for the fastest version of the model within the accuracy budget (with --data), protect it
(with a key), plan the service (replicas, batching, queue) with the server's own cost per request
measured on this machine, write a folder that modelpress serve, Ray Serve, KServe, Triton and
Docker run (each file read back by its tool), then serve the model as planned, drive it open-loop
at the planned rate and put the measured p99 beside the promise.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from modelpress.cli import options as opt
from modelpress.cli._common import console, print_notes
from modelpress.deploy import deploy
from modelpress.deploy.bundle import RECORDS
from modelpress.errors import OptionError
from modelpress.ir import load


def add_parser(sub) -> None:
    p = opt.add_command(
        sub,
        "deploy",
        __doc__,
        help="one command from a model to a service that meets --qps at --p99-ms: a folder for modelpress serve, Ray Serve, KServe, Triton, Docker",
        examples=[
            "modelpress deploy cnn.onnx -o cnn-deploy --qps 200 --p99-ms 50",
            "modelpress deploy cnn.onnx -o cnn-deploy --qps 200 --p99-ms 50 --data val.npz --labels-key y --key-file key.bin",
            "modelpress deploy bert.onnx -o bert-deploy --qps 2000 --p99-ms 20 --gpu L4,T4 --device cuda",
            "then: modelpress serve cnn-deploy | serve run cnn-deploy/ray-serve.yaml | kubectl apply -f cnn-deploy/kserve.yaml",
        ],
    )
    opt.add_model(p, help="an .onnx file")
    p.add_argument(
        "-o", "--output", required=True, metavar="DEPLOY_DIR", help="the folder to write"
    )
    p.add_argument("--qps", type=float, required=True, help="requests per second to serve")
    p.add_argument("--p99-ms", type=float, required=True, help="99th-percentile latency target, ms")
    opt.add_data(
        p,
        labels=True,
        help="validation samples (.npz named after the model's inputs): search for a faster version within --max-accuracy-drop",
    )
    opt.add_search_budget(
        p,
        drop="largest drop of the metric the search may cost",
        time="the search's time budget (90s, 10m, 1h)",
    )
    opt.add_switch(
        p,
        "--no-train",
        "search post-training steps only (by default, with --labels-key, half the samples "
        "train pruned, QAT and distilled candidates)",
    )
    opt.add_key(p)
    opt.add_list(p, "--gpu", metavar="NAME", help="GPUs of the advisor's catalog to plan on too")
    opt.add_with_default(
        p,
        "--device",
        default="cpu",
        help="where the service runs: cpu (this machine is measured) or cuda (a --gpu)",
    )
    p.add_argument("--name", help="the name the model is served under (default: the file name)")
    p.add_argument("--image", help="the container image KServe runs (default: NAME:latest)")
    opt.add_switch(p, "--no-check", "do not serve and measure the plan after writing")
    opt.add_with_default(
        p,
        "--check-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="how long the check sends requests",
        note="at most 2000 requests",
    )
    p.add_argument(
        "--catalog", action="append", metavar="FILE", help="CSV/JSON adding catalog entries"
    )
    opt.add_report(p)
    opt.add_record(p)
    p.set_defaults(func=run)


FLAGS = {
    "gpus": "--gpu",
}


@opt.speaks_flags(fields=FLAGS)
def run(args) -> int:
    if args.check_seconds <= 0:
        raise OptionError("--check-seconds must be positive")
    search = opt.search_args(args)
    recorder = opt.Recorder("deploy", args)
    with console.status("searching, planning and writing the folder"):
        result = deploy(
            args.model,
            args.output,
            **search,
            **opt.keywords(
                args,
                "qps",
                "p99_ms",
                "key_file",
                "key_env",
                "device",
                "name",
                "check_seconds",
                "image",
            ),
            gpus=opt.listed(args.gpu) or None,
            check=not args.no_check,
            catalog_files=args.catalog,
        )
    _print(result)
    _records(result, args)
    data = result.to_dict()
    recorder.write(data)
    return 0  # a missed plan is reported (and recorded), the folder is still written


def _records(result, args) -> None:
    """The record of every step in DEPLOY_DIR/records (``modelpress report`` reads the folder)."""
    folder = Path(result.folder) / RECORDS
    recorder = opt.Recorder("deploy", args)
    models = {}
    try:
        models["original"] = load(args.model)
    except Exception:  # noqa: BLE001 - a card is a bonus; the record is what matters
        pass
    if result.search is not None:
        auto = opt.Recorder("auto", args)
        auto.record(result.search.to_dict(), models=models).write(folder / "1-auto.json")
    data = result.to_dict()
    data.pop("search", None)
    recorder.record(data).write(folder / "2-deploy.json")


def _print(result) -> None:
    o, s = result.chosen, result.settings
    if result.search is not None and result.search.winner is not None:
        w = result.search.winner
        console.print(
            f"search: {escape(w.label)}, {w.ratio:.2f}x the original's latency, drop {max(w.drop, 0):.4g}",
            highlight=False,
        )
    c = result.cost
    console.print(
        f"server's own cost on this machine: {c.per_request_ms:.3g} ms per request + "
        f"{c.per_kb_ms:.3g} ms per KB (p99 spread {c.tail_ms:.3g} ms)",
        highlight=False,
    )
    console.print(
        f"plan: {o.replicas} x {escape(o.device)}, max batch {o.max_batch}, delay {o.max_delay_ms:.3g} ms, "
        f"queue {s.max_queue}; promised p99 {o.queue.p99_ms:.3g} ms at {result.plan.qps:g} requests/s",
        highlight=False,
    )
    t = Table(title="files", show_edge=False)
    for col in ("file", "read by", "status"):
        t.add_column(col)
    for ch in result.checks:
        t.add_row(
            escape(ch.file),
            escape(ch.tool),
            ch.status + (f": {escape(ch.detail)}" if ch.detail and ch.status != "ok" else ""),
        )
    console.print(t)
    m = result.check
    if m is not None:
        verdict = "[red]missed[/]" if m.missed else "[green]held[/]"
        p99 = "-" if m.load.p99_ms == float("inf") else f"{m.load.p99_ms:.3g}"
        console.print(
            f"check ({m.rate:.4g} requests/s to one replica, open loop, {m.load.sent} requests): "
            f"p99 {p99} ms (promised {m.promised_p99_ms:.3g}), p50 {m.load.p50_ms:.3g} ms, "
            f"{m.load.throughput:.4g} answered/s: {verdict}",
        )
        if m.missed:
            console.print(f"  {escape(m.reason)}", highlight=False)
    print_notes(result.notes)
    console.print(
        f"wrote {escape(result.folder)}: modelpress serve {escape(result.folder)} | "
        f"serve run {escape(result.folder)}/ray-serve.yaml | kubectl apply -f {escape(result.folder)}/kserve.yaml",
        highlight=False,
    )
