"""modelpress serve MODEL [MODEL ...]: an Open Inference Protocol (KServe v2) server with dynamic
batching, on this machine (FastAPI + uvicorn) or on Ray Serve (--ray)."""

from __future__ import annotations

import argparse

from modelpress.cli import options
from modelpress.cli._common import console, err_console
from modelpress.errors import OptionError, require
from modelpress.serve.auth import read_key_file
from modelpress.serve.options import ServeOptions
from modelpress.serve.ray_serve import ModelSource, deploy
from modelpress.serve.repository import Repository, model_name


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve models over HTTP (KServe v2 / Triton protocol) with dynamic batching",
        description=(
            "Serve models over the Open Inference Protocol (KServe v2) with Triton's binary tensors, "
            "dynamic batching, back-pressure, Prometheus metrics and graceful shutdown on SIGTERM."
        ),
        epilog="example: modelpress serve resnet.onnx bert.onnx --port 8000 --max-batch 32 --max-delay-ms 2",
    )
    p.add_argument(
        "models", nargs="+", metavar="MODEL", help=".onnx files (a protected .mpk with --key-file)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)",
    )
    p.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)"
    )
    options.add_list(
        p,
        "--name",
        metavar="NAME",
        help="the names to serve the models under, in order (default: file name without suffix)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=32,
        metavar="N",
        help="rows per model run (default 32; 1 turns batching off)",
    )
    p.add_argument(
        "--max-delay-ms",
        type=float,
        default=2.0,
        metavar="MS",
        help="how long an idle model waits for a batch to fill while requests are arriving (default 2)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="requests that may wait per model; past it 503 with Retry-After (default 256)",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="largest request body; past it 413 (default 64)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long to wait for accepted requests (default 30)",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' (KEY read from FILE) on every call but health",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=False,
        metavar="ADDRESS",
        help="deploy on Ray Serve (a local cluster, or the one at ADDRESS)",
    )
    p.add_argument("--ray-address", help=argparse.SUPPRESS)  # the old spelling of --ray ADDRESS
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="Ray Serve replicas per model (with --ray)",
    )
    options.add_device(p)
    options.add_key(p)
    options.add_record(p)
    p.set_defaults(func=run)


def run(args) -> int:

    require("fastapi", extra="serve", purpose="modelpress serve")
    require("uvicorn", extra="serve", purpose="modelpress serve")

    recorder = options.Recorder("serve", args)
    names = options.listed(args.name)
    if len(names) > len(args.models):
        raise OptionError(f"--name gives {len(names)} names for {len(args.models)} models")
    settings = ServeOptions(
        max_batch=args.max_batch,
        max_delay_ms=args.max_delay_ms,
        max_queue=args.max_queue,
        max_body_bytes=int(args.max_body_mb * 2**20),
        api_key=read_key_file(args.api_key_file) if args.api_key_file else None,
        drain_timeout_s=args.drain_timeout,
    )
    named = [
        (model_name(path, names[i] if i < len(names) else None), path)
        for i, path in enumerate(args.models)
    ]
    if isinstance(args.ray, str):
        args.ray, args.ray_address = True, args.ray
    if args.ray_address and not args.ray:
        raise OptionError("--ray-address needs --ray")
    if args.ray:
        return _run_ray(args, named, settings, recorder)

    from modelpress.serve.server import serve

    repo = Repository.open(
        [(name, options.open_model(path, args)) for name, path in named],
        backend=args.backend,
        device=args.device,
        place=args.place,
        strict=args.strict,
    )
    for w in repo.warnings:
        err_console.print(f"warning: {w}")
    if args.log_placement:
        for m in repo.models.values():
            for line in m.session.plan.log_lines():
                console.print(f"{m.name}: {line}")

    def started(host: str, port: int) -> None:
        for m in repo.models.values():
            batching = "batched" if m.batchable and settings.max_batch > 1 else "one request a run"
            extra = ", raw items" if m.processing is not None else ""
            console.print(
                f"model {m.name}: {', '.join(s.name for s in m.inputs)} ({batching}{extra}) on {m.session.device}"
            )
        console.print(
            f"serving on http://{host}:{port} (SIGTERM or Ctrl+C drains and stops)", soft_wrap=True
        )

    result = serve(repo, settings, host=args.host, port=args.port, on_started=started)
    for m in result.models:
        failed = sum(m["failures"].values())
        console.print(
            f"{m['name']}: {m['requests']} requests ({failed} refused or failed), {m['rows']} rows in {m['runs']} runs, busy {m['busy_s']:.1f} s"
        )
    console.print("stopped: every accepted request was answered")
    recorder.write(result.to_dict())
    return 0


def _run_ray(args, named, settings, recorder) -> int:

    sources = [ModelSource(name, options.open_model(path, args)) for name, path in named]
    deployment = deploy(
        sources,
        settings,
        address=args.ray_address,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        backend=args.backend,
        device=args.device,
    )
    console.print(
        f"serving on Ray Serve at http://{args.host}:{deployment.port} (SIGTERM or Ctrl+C stops)"
    )
    deployment.wait()
    console.print("stopped")
    recorder.write(
        {
            "host": args.host,
            "port": deployment.port,
            "ray": True,
            "models": [s.name for s in sources],
        }
    )
    return 0
