"""modelpress run MODEL --inputs in.npz -o out.npz: batch inference on stored inputs."""

from __future__ import annotations

import numpy as np

from modelpress.cli import options
from modelpress.cli._common import console, err_console


def add_parser(sub) -> None:
    from modelpress.runtime.backend import backend_names

    p = sub.add_parser(
        "run",
        help="run a model on inputs stored in an .npz file",
        description="Run a model on stored inputs and write its outputs under their names.",
        epilog="example: modelpress run model.onnx --inputs in.npz -o out.npz --device auto --log-placement",
    )
    p.add_argument("model", help="an .onnx file")
    p.add_argument("--inputs", required=True, metavar="FILE.npz", help="arrays named after the model's inputs")
    p.add_argument("-o", "--output", required=True, metavar="FILE.npz", help="where to write the outputs")
    add_device_options(p, backend_names())
    p.add_argument("--batch-size", type=int, help="split the inputs along axis 0 into batches of this size")
    p.set_defaults(func=run)


def add_device_options(p, backends: list[str]) -> None:
    p.add_argument("--backend", default="ort", choices=backends, help="execution backend (default ort)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps, ...")
    p.add_argument("--place", action="append", metavar="PATTERN=DEVICE", help="pin an op type or node-name glob to a device (repeatable)")
    p.add_argument("--strict", action="store_true", help="fail instead of falling back to the CPU when a device is missing")
    p.add_argument("--log-placement", action="store_true", help="print node → device and the copies between devices")


def make_session(args):
    from modelpress.runtime.session import Session

    sess = Session(options.open_model(args.model, args), backend=args.backend, device=args.device, place=args.place, strict=args.strict)
    for w in sess.warnings:
        err_console.print(f"warning: {w}")
    if args.log_placement:
        for line in sess.plan.log_lines():
            console.print(line)
    return sess


def run(args) -> int:
    from modelpress.errors import OptionError
    from modelpress.ir.feeds import check_feeds, load_npz
    from modelpress.ir.files import write_npz

    feeds = load_npz(args.inputs)
    sess = make_session(args)
    if args.batch_size is not None and args.batch_size < 1:
        raise OptionError("--batch-size must be at least 1")
    first = {k: v[: args.batch_size] for k, v in feeds.items()} if args.batch_size else feeds
    check_feeds(sess.model, first, source=args.inputs)
    if args.batch_size:
        n = min(a.shape[0] for a in feeds.values() if a.ndim)
        parts = [
            sess.run({k: v[i : i + args.batch_size] for k, v in feeds.items()}, check=False)
            for i in range(0, n, args.batch_size)
        ]
        outputs = {k: np.concatenate([p[k] for p in parts]) for k in sess.output_names}
    else:
        outputs = sess.run(feeds, check=False)
    write_npz(args.output, outputs)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
    console.print(f"wrote {args.output}: {shapes} (device {sess.device})")
    return 0
