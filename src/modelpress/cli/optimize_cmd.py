"""modelpress optimize IN -o OUT: graph rewrites to a fixed point, verified against the input."""

from __future__ import annotations

import argparse

from rich.table import Table

from modelpress.cli._common import console, human_bytes, write_json
from modelpress.cli.options import Recorder, add_report
from modelpress.cli.verify_cmd import add_verify_options, print_verify, verify_from_args


def add_parser(sub) -> None:
    from modelpress.passes import REGISTRY

    names = "\n".join(f"  {n:<24} level {c.level}  {(c.__doc__ or '').strip().splitlines()[0]}" for n, c in REGISTRY.items())
    p = sub.add_parser(
        "optimize",
        help="rewrite a model's graph to run faster, verified against the original",
        description="Rewrite a model's graph (clean-up, constant folding, fusion, reordering) and verify the result.",
        epilog=f"passes:\n{names}\n\nexample: modelpress optimize model.onnx -o fast.onnx --level 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", required=True, help="where to write the optimized model")
    p.add_argument("--level", type=int, default=2, choices=[0, 1, 2, 3], help="1: clean-up, 2: standard ONNX rewrites (default), 3: ONNX Runtime-specific")
    p.add_argument("--passes", nargs="+", metavar="PASS", help="run exactly these passes")
    p.add_argument("--skip", nargs="+", metavar="PASS", default=[], help="passes not to run")
    p.add_argument("--opset", type=int, help="upgrade to this opset first (lets fusions use newer standard ops)")
    p.add_argument("--no-verify", action="store_true", help="do not compare the result with the input")
    p.add_argument("--external-data", action="store_true", help="store weights in OUT.data beside the model")
    p.add_argument("--json", metavar="FILE", help="also write what changed as JSON")
    add_report(p)
    add_verify_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from modelpress.ir import graph_stats, load, save
    from modelpress.ir.files import output_dir
    from modelpress.ir.io import model_bytes
    from modelpress.passes import optimize

    output_dir(args.output)
    recorder = Recorder("optimize", args)
    original = load(args.model)
    before = graph_stats(original)
    size_before = len(model_bytes(original))
    model = load(args.model)
    result = optimize(model, level=args.level, passes=args.passes, skip=args.skip, opset=args.opset)
    after = graph_stats(result.model)

    t = Table(title="passes", show_edge=False)
    t.add_column("pass")
    t.add_column("rewrites", justify="right")
    t.add_column("ms", justify="right")
    for p in result.passes:
        if p.rewrites:
            t.add_row(p.name, str(p.rewrites), f"{p.seconds * 1e3:.1f}")
    console.print(t)
    size_after = len(model_bytes(result.model))
    console.print(
        f"nodes {before.node_count} → {after.node_count}, size {human_bytes(size_before)} → {human_bytes(size_after)}, "
        f"{result.rounds} round(s) in {result.seconds * 1e3:.0f} ms"
    )
    verified = None
    if not args.no_verify:
        verified = verify_from_args(args, original, result.model)
        print_verify(verified)
        if not verified.passed:
            verified.raise_if_failed("the optimized model and the original")
    save(result.model, args.output, external_data=True if args.external_data else None)
    console.print(f"wrote {args.output}")
    data = result.to_dict()
    data.update(nodes_before=before.node_count, nodes_after=after.node_count, verify=verified.to_dict() if verified else None)
    if args.json:
        write_json(args.json, data)
    recorder.write_page(data, models={"input": original, "output": result.model})
    return 0


