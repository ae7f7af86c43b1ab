"""modelpress verify A B: run both models on the same inputs and compare every output.

Run two models under ONNX Runtime (its optimizations off) on the same inputs and compare every
output. Generated inputs are fitted to what the first model can run on.
"""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, err_console, print_notes
from modelpress.cli._verify_llm import add_llm_options, run_llm
from modelpress.ir.feeds import load_npz
from modelpress.ir.llm import is_llm_folder
from modelpress.verify import verify


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "verify",
        __doc__,
        help="check that two models compute the same outputs",
        examples=[
            "modelpress verify model.onnx fast.onnx --dim batch=4 --input-sets 3",
            "modelpress verify llm_dir int4_dir --data text.txt --json check.json   (perplexity of each, their ratio, greedy top-1 agreement)",
        ],
    )
    p.add_argument(
        "reference",
        metavar="REFERENCE",
        help="the model to compare against (.onnx; a protected .mpk with --key-file; an LLM folder)",
    )
    p.add_argument(
        "candidate",
        metavar="CANDIDATE",
        help="the model to check (.onnx; a protected .mpk with --key-file; an LLM folder)",
    )
    options.add_key(p)
    add_check_options(p)
    add_llm_options(p)
    options.add_record(p)
    p.set_defaults(func=run)


def add_check_options(p: argparse.ArgumentParser) -> None:
    """The options of a numeric check: which inputs, how many sets, which tolerance."""
    options.add_inputs(p, to="to compare on")
    options.add_with_default(
        p, "--input-sets", type=int, default=2, metavar="N", help="number of generated input sets"
    )
    p.add_argument(
        "--rtol", type=float, help="relative tolerance (default per dtype: 1e-4 for float32)"
    )
    p.add_argument("--atol", type=float, help="absolute tolerance (default per dtype)")


def check_options(args) -> dict:
    """The keyword arguments of ``modelpress.verify.verify`` that ``add_check_options`` sets."""

    options.require_positive(args.input_sets, "--input-sets")
    return {
        "data": load_npz(args.data) if args.data else None,
        "dims": options.dims(args),
        "shapes": options.shapes(args),
        "input_sets": args.input_sets,
        "rtol": args.rtol,
        "atol": args.atol,
    }


def print_verify(result, title: str | None = None) -> None:
    print_notes(result.notes, to=err_console)
    t = Table(title=title, show_edge=False)
    for col in ("output", "dtype", "shape", "max abs", "max rel", "tolerance", ""):
        t.add_column(col)
    for o in result.outputs:
        t.add_row(
            escape(o.name),
            o.dtype,
            str(list(o.shape)),
            f"{o.max_abs:.3g}",
            f"{o.max_rel:.3g}",
            f"rel {o.rtol:g}",
            "[green]ok[/]" if o.passed else "[red]FAIL[/]",
        )
    console.print(t)


@options.speaks_flags
def run(args) -> int:

    if is_llm_folder(args.reference) or is_llm_folder(args.candidate):
        return run_llm(args)
    record = options.Recorder("verify", args)
    result = verify(
        options.open_model(args.reference, args),
        options.open_model(args.candidate, args),
        **check_options(args),
    )
    print_verify(result)
    console.print(
        f"{'[green]PASS[/]' if result.passed else '[red]FAIL[/]'} over {result.runs} input set(s)"
    )
    record.write(result.to_dict())
    return 0 if result.passed else 1
