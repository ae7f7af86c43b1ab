"""modelpress ops [MODEL] --backend torch: the ops a backend implements, or a model's missing ones.

List the ONNX ops a backend implements, grouped by family; given a model, list the model's ops the
backend does not implement.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console
from modelpress.runtime.op_support import SUPPORT_LISTS, op_support


def add_parser(sub) -> None:

    p = options.add_command(
        sub,
        "ops",
        __doc__,
        help="list the ops a backend supports (or check a model against them)",
        examples=["modelpress ops --backend torch", "modelpress ops model.onnx --backend torch"],
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        help="an .onnx file: report which of its ops are not supported",
    )
    p.add_argument("--model", dest="model_flag", help=argparse.SUPPRESS)  # the old spelling
    options.add_with_default(
        p, "--backend", default="torch", choices=sorted(SUPPORT_LISTS), help="backend"
    )
    options.add_record(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:

    record = options.Recorder("ops", args)
    path = args.model or args.model_flag
    report = op_support(args.backend, options.open_model(path, args) if path else None)
    if path:
        if report.missing:
            console.print(
                f"{path}: {len(report.missing)} of {len(report.model_ops)} op types not supported by {args.backend}: {', '.join(report.missing)}"
            )
        else:
            console.print(
                f"{path}: all {len(report.model_ops)} op types are supported by {args.backend}"
            )
    else:
        t = Table(
            title=f"ops supported by the {args.backend} backend ({len(report.ops)})",
            show_edge=False,
        )
        t.add_column("family")
        t.add_column("ops")
        for family, names in report.families.items():
            t.add_row(family, ", ".join(names))
        console.print(t)
    data = report.to_dict()
    if path:
        data["model"] = path
    record.write(data)
    return 0
