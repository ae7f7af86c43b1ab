"""modelpress optimize IN -o OUT: graph rewrites to a fixed point, verified against the input.

Rewrite a model's graph (clean-up, constant folding, fusion, reordering) and verify the result.
"""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes
from modelpress.cli.verify_cmd import add_check_options, check_options, print_verify
from modelpress.passes import REGISTRY
from modelpress.passes.verified import optimize_verified


def add_parser(sub) -> None:

    names = "\n".join(
        f"  {n:<24} level {c.level}  {(c.__doc__ or '').strip().splitlines()[0]}"
        for n, c in REGISTRY.items()
    )
    p = options.add_command(
        sub,
        "optimize",
        __doc__,
        help="rewrite a model's graph to run faster, verified against the original",
        epilog=f"passes:\n{names}\n\nexample: modelpress optimize model.onnx -o fast.onnx --level 2",
    )
    options.add_model(p)
    options.add_key(p)
    options.add_output(p, help="where to write the optimized model")
    options.add_with_default(
        p,
        "--level",
        type=int,
        default=2,
        choices=[0, 1, 2, 3],
        help="1: clean-up, 2: standard ONNX rewrites, 3: ONNX Runtime-specific",
    )
    options.add_list(p, "--passes", metavar="PASS", help="run exactly these passes")
    options.add_list(p, "--skip", metavar="PASS", help="passes not to run")
    p.add_argument(
        "--opset",
        type=int,
        help="upgrade to this opset first (lets fusions use newer standard ops)",
    )
    options.add_switch(p, "--no-verify", "do not compare the result with the input")
    options.add_switch(p, "--external-data", "store weights in OUT.data beside the model")
    add_check_options(p)
    options.add_record(p)
    options.add_report(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:

    record = options.Recorder("optimize", args)
    # (the optimizer works in place: the record's card of the input is read from a copy)
    original = options.open_model(args.model, args) if record.wanted else None
    verify_options = check_options(args)
    result = optimize_verified(
        options.open_model(args.model, args),
        output=args.output,
        level=args.level,
        passes=options.listed(args.passes) or None,
        skip=options.listed(args.skip),
        opset=args.opset,
        check=not args.no_verify,
        verify_options=verify_options,
        external_data=True if args.external_data else None,
    )
    t = Table(title="passes", show_edge=False)
    t.add_column("pass")
    t.add_column("rewrites", justify="right")
    t.add_column("ms", justify="right")
    for p in result.optimized.passes:
        if p.rewrites:
            t.add_row(p.name, str(p.rewrites), f"{p.seconds * 1e3:.1f}")
    console.print(t)
    console.print(
        f"nodes {result.nodes_before} → {result.nodes_after}, size {human_bytes(result.bytes_before)} → "
        f"{human_bytes(result.bytes_after)}, {result.optimized.rounds} round(s) in {result.optimized.seconds * 1e3:.0f} ms"
    )
    if result.verify is not None:
        print_verify(result.verify)
        result.verify.raise_if_failed("the optimized model and the original")
    console.print(f"wrote {result.output}")
    record.write(result.to_dict(), models={"input": original, "output": result.optimized.model})
    return 0
