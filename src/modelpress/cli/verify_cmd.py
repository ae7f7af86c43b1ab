"""modelpress verify A B: run both models on the same inputs and compare every output."""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, write_json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check that two models compute the same outputs",
        description="Run two models under ONNX Runtime (its optimizations off) on the same inputs and compare outputs.",
        epilog="example: modelpress verify model.onnx fast.onnx --dim batch=4 --runs 3",
    )
    add_verify_options(p)
    p.add_argument("reference", help="the model to compare against")
    p.add_argument("candidate", help="the model to check")
    p.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    p.set_defaults(func=run)


def add_verify_options(p) -> None:
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs to use instead of generated ones")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE", help="size of a named dynamic dimension (repeatable)")
    p.add_argument("--runs", type=int, default=2, help="number of generated input sets (default 2)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default per dtype: 1e-4 for float32)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default per dtype)")


def verify_from_args(args, reference, candidate):
    from modelpress.ir.feeds import load_npz
    from modelpress.ir.shapes import parse_dims
    from modelpress.verify import verify

    inputs = load_npz(args.inputs) if args.inputs else None
    return verify(reference, candidate, inputs=inputs, dims=parse_dims(args.dim), runs=args.runs, rtol=args.rtol, atol=args.atol)


def print_verify(result) -> None:
    t = Table(show_edge=False)
    for col in ("output", "dtype", "shape", "max abs", "max rel", "tolerance", ""):
        t.add_column(col)
    for o in result.outputs:
        t.add_row(o.name, o.dtype, str(list(o.shape)), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", f"rel {o.rtol:g}", "[green]ok[/]" if o.passed else "[red]FAIL[/]")
    console.print(t)


def run(args) -> int:

    result = verify_from_args(args, options.open_model(args.reference, args), options.open_model(args.candidate, args))
    print_verify(result)
    console.print(f"{'[green]PASS[/]' if result.passed else '[red]FAIL[/]'} over {result.runs} input set(s)")
    if args.json:
        write_json(args.json, result.to_dict())
    return 0 if result.passed else 1
