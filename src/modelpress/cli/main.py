"""Entry point of the ``modelpress`` command.

Each subcommand lives in its own module with ``add_parser(subparsers)`` (which sets ``func``).
A ``ModelpressError`` becomes one ``error:`` line on stderr and exit code 1, never a traceback.
A command line that names its command loads that command's module alone: what the others import
(onnx_ir, the optimizer, the report) stays out of, say, a server's memory.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from modelpress import __version__
from modelpress.cli.options import add_old_spellings, flags_of, in_flags
from modelpress.errors import ModelpressError

# Module names under modelpress.cli, in the order `--help` lists them.
COMMANDS = (
    "demo_cmd",
    "convert_cmd",
    "inspect_cmd",
    "optimize_cmd",
    "verify_cmd",
    "quantize_cmd",
    "prune_cmd",
    "distill_cmd",
    "compress_cmd",
    "keygen_cmd",
    "protect_cmd",
    "pipeline_cmd",
    "run_cmd",
    "generate_cmd",
    "serve_cmd",
    "bench_cmd",
    "ops_cmd",
    "advise_cmd",
    "auto_cmd",
    "deploy_cmd",
    "recipe_cmd",
    "report_cmd",
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone (one of ``COMMANDS`` without
    ``_cmd``)."""
    parser = argparse.ArgumentParser(
        prog="modelpress",
        description="Make a trained model ready for the hardware it runs on.",
    )
    parser.add_argument("--version", action="version", version=f"modelpress {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if command is None else [f"{command}_cmd"]:
        importlib.import_module(f"modelpress.cli.{name}").add_parser(sub)
    for name, sub_parser in sub.choices.items():
        add_old_spellings(name, sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = argv[0] if argv and f"{argv[0]}_cmd" in COMMANDS else None
    parser = build_parser(named)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ModelpressError as exc:
        # the library names its fields (`max_batch`); the command line says its flags
        command = parser._subparsers._group_actions[0].choices[args.command]
        print(f"error: {in_flags(str(exc), flags_of(command))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
