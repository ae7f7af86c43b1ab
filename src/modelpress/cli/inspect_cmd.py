"""modelpress inspect MODEL: interface, opsets, op histogram, parameters, FLOPs, per-node table."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from modelpress.cli._common import console, human_bytes, human_count, write_json
from modelpress.cli.options import add_key, open_model


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="show a model's inputs, outputs, ops, parameters and FLOPs",
        description="Show a model's inputs and outputs, opsets, op histogram, parameters and FLOPs.",
        epilog="example: modelpress inspect model.onnx --shape input=1x3x224x224 --nodes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an .onnx file (a protected .mpk with --key-file)")
    add_key(p)
    p.add_argument("--shape", action="append", metavar="NAME=DxDx...", help="input shape for FLOPs (repeatable)")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE", help="size of a named dynamic dimension for FLOPs (default 1)")
    p.add_argument("--nodes", action="store_true", help="print a per-node table (FLOPs, bytes, output shape)")
    p.add_argument("--top", type=int, default=25, help="rows of the per-node table, largest FLOPs first (0: all)")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from modelpress.ir import graph_stats, parse_shapes
    from modelpress.ir.shapes import parse_dims
    from modelpress.profile import profile_model
    from modelpress.verify.inputs import resolve_shape

    model = open_model(args.model, args, runnable=False)
    stats = graph_stats(model)
    shapes = parse_shapes(args.shape)
    dims = parse_dims(args.dim)
    defaulted = []
    for value in model.graph.inputs:
        if value.name not in shapes and value.name not in model.graph.initializers and value.shape is not None:
            defaulted += [str(d) for d in value.shape if not isinstance(d, int) and str(d) not in dims]
            shapes[value.name] = resolve_shape(value, dims, default_dim=1)
    cost = profile_model(model, shapes)

    console.print(f"[bold]{escape(args.model)}[/]  ir_version {model.ir_version}, producer {model.producer_name or '?'} {model.producer_version or ''}")
    console.print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in stats.opsets.items()))
    io = Table(title="interface", show_edge=False)
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind, values in (("input", stats.inputs), ("output", stats.outputs)):
        for v in values:
            io.add_row(kind, escape(v["name"]), v["dtype"], "?" if v["shape"] is None else escape("[" + ", ".join(map(str, v["shape"])) + "]"))
    console.print(io)
    console.print(
        f"nodes {stats.node_count} (+{stats.constant_nodes} Constant), subgraphs {stats.subgraphs}, "
        f"parameters {human_count(stats.parameters)} ({human_bytes(stats.parameter_bytes)})"
    )
    flops_note = "" if not cost.unknown_shapes else f"  ({cost.unknown_shapes} nodes with unknown shapes not counted; set --shape)"
    if defaulted:
        console.print(f"dynamic dimensions set to 1 for FLOPs: {escape(', '.join(sorted(set(defaulted))))} (set them with --dim NAME=SIZE)")
    console.print(f"FLOPs {human_count(cost.flops)}, bytes moved ≥ {human_bytes(cost.bytes)}{flops_note}")
    ops = Table(title="ops", show_edge=False)
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in stats.op_counts.items():
        ops.add_row(op, str(n))
    console.print(ops)
    if args.nodes:
        rows = sorted(cost.nodes, key=lambda n: -n.flops)
        rows = rows if args.top == 0 else rows[: args.top]
        t = Table(title="nodes (largest FLOPs first)", show_edge=False)
        for col in ("node", "op", "FLOPs", "weights", "activations", "output shape"):
            t.add_column(col, justify="right" if col in ("FLOPs", "weights", "activations") else "left")
        for n in rows:
            t.add_row(escape(n.name), n.op_type, human_count(n.flops), human_bytes(n.weight_bytes), human_bytes(n.activation_bytes), escape(str(list(n.output_shape))) if n.output_shape else "?")
        console.print(t)
    if args.json:
        data = stats.to_dict()
        data["flops"] = cost.flops
        data["bytes"] = cost.bytes
        data["nodes"] = [n.__dict__ for n in cost.nodes]
        write_json(args.json, data)
    return 0
