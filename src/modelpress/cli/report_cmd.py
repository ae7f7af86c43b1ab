"""modelpress report RUNS... -o report.html: records of any commands as one self-contained page.

Read the records that commands write with --json (files, or folders of .json files) and write one
self-contained HTML page: model cards, what each command changed, per-layer quantization error,
latency and accuracy before and after, loss curves, the search's Pareto front, the roofline and the
advisor's costs. The page loads nothing from the network.
"""

from __future__ import annotations

from rich.markup import escape

from modelpress.cli import options as opt
from modelpress.cli._common import console
from modelpress.ir.files import output_dir
from modelpress.report.page import read_records, write_report


def add_parser(sub) -> None:
    p = opt.add_command(
        sub,
        "report",
        __doc__,
        help="turn command records (--json) into one HTML page with charts",
        examples=["modelpress report runs/ -o report.html"],
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a record (.json) or a folder of records")
    opt.add_output(p, help="the page to write (.html)")
    p.add_argument(
        "--title",
        default="modelpress report",
        help="the page's title (default 'modelpress report')",
    )
    opt.add_record(p)
    p.set_defaults(func=run)


def run(args) -> int:

    output_dir(args.output)
    recorder = opt.Recorder("report", args)
    records = read_records(args.runs)
    write_report(records, args.output, title=args.title)
    recorder.write(
        {
            "records": [str(r) for r in args.runs],
            "commands": [r.command for r in records],
            "page": args.output,
        }
    )
    console.print(f"wrote {escape(args.output)} ({len(records)} record(s))")
    return 0
