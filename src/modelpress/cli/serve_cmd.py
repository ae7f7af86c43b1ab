"""modelpress serve MODEL [MODEL ...]: an Open Inference Protocol (KServe v2) server with dynamic
batching, on this machine (FastAPI + uvicorn) or on Ray Serve (--ray); an LLM folder is served on
OpenAI-compatible routes (/v1/completions, /v1/chat/completions) with continuous batching.

Serve models over the Open Inference Protocol (KServe v2) with Triton's binary tensors, dynamic
batching, back-pressure, Prometheus metrics and graceful shutdown on SIGTERM. MODEL may be one
folder written by modelpress deploy (DEPLOY_DIR): its serve.yaml gives the model, its name and the
planned batching and queue (flags given still win).
"""

from __future__ import annotations

import argparse

from modelpress.cli import options
from modelpress.cli._common import console, err_console
from modelpress.errors import OptionError, require
from modelpress.ir.llm import is_llm_folder
from modelpress.serve.auth import read_key_file
from modelpress.serve.options import ServeOptions
from modelpress.serve.repository import Repository, model_name


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "serve",
        __doc__,
        help="serve models over HTTP (KServe v2 / Triton protocol) with dynamic batching",
        examples=[
            "modelpress serve resnet.onnx bert.onnx --port 8000 --max-batch 32 --max-delay-ms 2"
        ],
    )
    p.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help=".onnx files (a protected .mpk with --key-file), or LLM folders (modelpress convert)",
    )
    options.add_with_default(
        p, "--host", default="127.0.0.1", help="address to listen on", note="0.0.0.0 for all"
    )
    options.add_with_default(
        p, "--port", type=int, default=8000, help="port to listen on", note="0: any free port"
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
        metavar="N",
        help="rows per model run (default 32; 1 turns batching off)",
    )
    options.add_batching(p)
    p.add_argument(
        "--max-delay-ms",
        type=float,
        metavar="MS",
        help="how long an idle model waits for a batch to fill while requests are arriving (default 2)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        help="requests that may wait per model; past it 503 with Retry-After (default 256)",
    )
    options.add_with_default(
        p,
        "--max-body-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="largest request body; past it 413",
    )
    p.add_argument(
        "--max-request-rows",
        type=int,
        metavar="N",
        help="most rows one request may bring; past it 413 (default: --max-batch, at least 64)",
    )
    p.add_argument(
        "--max-pending-mb",
        type=float,
        metavar="MB",
        help="request bytes the server holds at once (being read, decoded, queued or run); "
        "past it 503 (default 256, at least 4 bodies)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        metavar="N",
        help="open connections; past it the slowest to send its request is closed "
        "(default 1000, kept below the open-file limit)",
    )
    options.add_with_default(
        p,
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds for a request's headers to arrive; past it 408",
    )
    options.add_with_default(
        p,
        "--body-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds for a request's body to arrive; past it 408",
    )
    options.add_with_default(
        p,
        "--max-seqs",
        type=int,
        default=16,
        metavar="N",
        help="LLM: sequences generated at once; the rest wait",
    )
    p.add_argument(
        "--max-context",
        type=int,
        metavar="N",
        help="LLM: most tokens of prompt and answer (default: the model's own)",
    )
    options.add_with_default(
        p,
        "--prefill-chunk",
        type=int,
        default=256,
        metavar="N",
        help="LLM: prompt tokens run between two decode steps of the running streams",
    )
    options.add_with_default(
        p,
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long to wait for accepted requests",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' (KEY read from FILE) on every call but health",
    )
    options.add_ray(
        p, on="deploy on Ray Serve", replicas="Ray Serve replicas per model (with --ray)"
    )
    p.add_argument("--ray-address", help=argparse.SUPPRESS)  # the old spelling of --ray ADDRESS
    options.add_device(p)
    options.add_key(p)
    options.add_record(p)
    p.set_defaults(func=run)


DEFAULTS = {"max_batch": 32, "max_delay_ms": 2.0, "max_queue": 256, "replicas": 1}


def _from_folder(args) -> None:
    """A deploy folder (``modelpress deploy``) as the one MODEL: its model, name and settings
    become the defaults; flags given still win. Otherwise the usual defaults."""
    from modelpress.deploy.settings import is_folder, read_folder

    folder = args.models[0] if len(args.models) == 1 and is_folder(args.models[0]) else None
    settings = None
    if folder is not None:
        settings, model = read_folder(folder)
        args.models = [str(model)]
        args.name = args.name or [settings.name]
        if settings.protected and not (args.key_file or args.key_env):
            raise OptionError(
                f"{folder}: its model is protected: give its key with --key-file or --key-env"
            )
        if args.device == "auto":
            args.device = settings.device
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, getattr(settings, key) if settings is not None else default)


def run(args) -> int:

    _from_folder(args)
    require("fastapi", extra="serve", purpose="modelpress serve")
    require("uvicorn", extra="serve", purpose="modelpress serve")
    require("httptools", extra="serve", purpose="modelpress serve")

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
        max_request_rows=args.max_request_rows,
        max_pending_bytes=(
            int(args.max_pending_mb * 2**20) if args.max_pending_mb is not None else None
        ),
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_seqs=args.max_seqs,
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
    )
    named = [
        (model_name(path, names[i] if i < len(names) else None), path)
        for i, path in enumerate(args.models)
    ]
    if isinstance(args.ray, str):
        args.ray, args.ray_address = True, args.ray
    if args.ray_address and not args.ray:
        raise OptionError("--ray-address needs --ray")
    llm_named = [(name, path) for name, path in named if is_llm_folder(path)]
    named = [(name, path) for name, path in named if not is_llm_folder(path)]
    if args.ray:
        if llm_named:
            raise OptionError(f"--ray serves ONNX models, not LLM folders ({llm_named[0][1]})")
        return _run_ray(args, named, settings, recorder)

    from modelpress.serve.server import serve

    llms = []
    if llm_named:
        from modelpress.runtime.generate import open_llm

        # no spinning: the runtime's idle threads would take the cores the event loop needs
        llms = [(name, open_llm(path, spinning=False)) for name, path in llm_named]
    # (LLM folders alone: an empty repository, without the graph tools that open ONNX models)
    repo = (
        Repository.open(
            [(name, options.open_model(path, args)) for name, path in named],
            **options.placement(args),
            batching=args.batching,
        )
        if named
        else Repository([])
    )
    for m in repo.models.values():
        if not m.batchable and args.max_batch > 1:
            err_console.print(
                f"note: {m.name}: --max-batch {args.max_batch} ignored, each request runs alone: "
                f"{m.batch_reason or 'the model is not per-sample along axis 0'} "
                "(--batching per-sample overrides this)"
            )
    for w in repo.warnings:
        err_console.print(f"warning: {w}")
    for name, llm in llms:
        why = llm.batch_variance() if args.max_seqs > 1 else None
        if why:
            err_console.print(
                f"note: {name}: a batched greedy answer can differ from the same request "
                f"alone: {why}"
            )
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
        for name, llm in llms:
            context = settings.max_context or llm.config.max_context
            console.print(
                f"llm {name}: /v1/completions, /v1/chat/completions "
                f"({settings.max_seqs} sequences at once, context {context})"
            )
        console.print(
            f"serving on http://{host}:{port} (SIGTERM or Ctrl+C drains and stops)", soft_wrap=True
        )

    result = serve(repo, settings, host=args.host, port=args.port, on_started=started, llms=llms)
    for m in result.models:
        failed = sum(m["failures"].values())
        if m.get("llm"):
            console.print(
                f"{m['name']}: {m['requests']} requests ({failed} refused or failed), "
                f"{m['rows']} tokens in {m['runs']} decode steps, busy {m['busy_s']:.1f} s"
            )
            continue
        console.print(
            f"{m['name']}: {m['requests']} requests ({failed} refused or failed), {m['rows']} rows in {m['runs']} runs, busy {m['busy_s']:.1f} s"
        )
    if result.refused:
        by_status = ", ".join(f"{n} x {code}" for code, n in sorted(result.refused.items()))
        console.print(f"refused before reaching a model: {by_status}")
    if result.cut:
        console.print(
            f"stopped: {result.cut} accepted requests were not answered within --drain-timeout "
            f"{settings.drain_timeout_s:g} s (they got 503)"
        )
    else:
        console.print("stopped: every accepted request was answered")
    recorder.write(result.to_dict())
    return 0


def _run_ray(args, named, settings, recorder) -> int:
    from modelpress.serve.ray_serve import ModelSource, deploy

    sources = [ModelSource(name, options.open_model(path, args)) for name, path in named]
    deployment = deploy(
        sources,
        settings,
        address=args.ray_address,
        **options.keywords(args, "host", "port", "replicas", "backend", "device"),
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
