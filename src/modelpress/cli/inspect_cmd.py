"""modelpress inspect MODEL: interface, opsets, op histogram, parameters, FLOPs, per-node table.

Show a model's inputs and outputs, opsets, op histogram, parameters and FLOPs.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes, human_count
from modelpress.profile.inspect import inspect_model


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "inspect",
        __doc__,
        help="show a model's inputs, outputs, ops, parameters and FLOPs",
        examples=["modelpress inspect model.onnx --shape input=1x3x224x224 --nodes"],
    )
    options.add_model(p)
    options.add_key(p)
    options.add_shapes(p)
    options.add_switch(p, "--nodes", "print a per-node table (FLOPs, bytes, output shape)")
    p.add_argument(
        "--top",
        type=int,
        default=25,
        metavar="N",
        help="rows of the per-node table, largest FLOPs first (0: all; default 25)",
    )
    options.add_record(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:

    record = options.Recorder("inspect", args)
    model = options.open_model(args.model, args, runnable=False)
    found = inspect_model(model, shapes=options.shapes(args), dims=options.dims(args))
    stats, cost = found.stats, found.cost

    console.print(
        f"[bold]{escape(args.model)}[/]  ir_version {model.ir_version}, producer {escape(model.producer_name or '?')} {escape(model.producer_version or '')}"
    )
    console.print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in stats.opsets.items()))
    io = Table(title="interface", show_edge=False)
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind, values in (("input", stats.inputs), ("output", stats.outputs)):
        for v in values:
            io.add_row(
                kind,
                escape(v["name"]),
                v["dtype"],
                "?" if v["shape"] is None else escape("[" + ", ".join(map(str, v["shape"])) + "]"),
            )
    console.print(io)
    console.print(
        f"nodes {stats.node_count} (+{stats.constant_nodes} Constant), subgraphs {stats.subgraphs}, "
        f"parameters {human_count(stats.parameters)} ({human_bytes(stats.parameter_bytes)})"
    )
    flops_note = (
        ""
        if not cost.unknown_shapes
        else f"  ({cost.unknown_shapes} nodes with unknown shapes not counted; set --shape)"
    )
    if found.defaulted:
        console.print(
            f"dynamic dimensions set to 1 for FLOPs: {escape(', '.join(found.defaulted))} (set them with --dim NAME=SIZE or --shape)"
        )
    console.print(
        f"FLOPs {human_count(cost.flops)}, bytes moved ≥ {human_bytes(cost.bytes)}{flops_note}"
    )
    ops = Table(title="ops", show_edge=False)
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in stats.op_counts.items():
        ops.add_row(escape(op), str(n))
    console.print(ops)
    if args.nodes:
        rows = sorted(cost.nodes, key=lambda n: -n.flops)
        rows = rows if args.top == 0 else rows[: args.top]
        t = Table(title="nodes (largest FLOPs first)", show_edge=False)
        for col in ("node", "op", "FLOPs", "weights", "activations", "output shape"):
            t.add_column(
                col, justify="right" if col in ("FLOPs", "weights", "activations") else "left"
            )
        for n in rows:
            t.add_row(
                escape(n.name),
                n.op_type,
                human_count(n.flops),
                human_bytes(n.weight_bytes),
                human_bytes(n.activation_bytes),
                escape(str(list(n.output_shape))) if n.output_shape else "?",
            )
        console.print(t)
    record.write(found.to_dict())
    return 0
