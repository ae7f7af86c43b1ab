"""The files a command reads and writes: the model (and the key of a protected one), the
output, the command's record (``--json``) and its page (``--report``)."""

from __future__ import annotations

import argparse
import os
import time

import modelpress
from modelpress.ir.files import output_dir
from modelpress.report.record import Record


def add_model(
    p: argparse.ArgumentParser, *, help: str | None = None, required: bool = True
) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs=None if required else "?",
        help=help or "an .onnx file (a protected .mpk with --key-file)",
    )


def add_output(
    p: argparse.ArgumentParser, *, required: bool = True, help: str | None = None
) -> None:
    p.add_argument(
        "-o",
        "--output",
        required=required,
        metavar="FILE",
        help=help or "where to write the result",
    )


def add_record(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the command's record (what it did and measured) as JSON, for `modelpress report`",
    )


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML page of this run (model card, charts)",
    )


def add_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key-file", metavar="FILE", help="the key of a protected model (.mpk)")
    p.add_argument("--key-env", metavar="VAR", help="an environment variable holding the key (hex)")


def open_model(
    path: str | os.PathLike, args: argparse.Namespace | None = None, *, runnable: bool = True
):
    """The model at ``path`` in memory: an ONNX file loaded, or a protected model (an ``.mpk``
    package, or an obfuscated ONNX file) opened in memory with the key options of ``args``. The
    one way every command reads its model. ``runnable=False`` (inspect) lets an obfuscated ONNX
    file without a key through as the file shows it."""

    return modelpress.open(
        path,
        key_file=getattr(args, "key_file", None),
        key_env=getattr(args, "key_env", None),
        runnable=runnable,
    )


class Recorder:
    """The command's record, written through the report schema when ``--json`` was given, and its
    page when ``--report`` was (``add_report``).

    ``models`` (role → ``onnx_ir.Model``) become model cards; ``charts`` is data for charts the
    result does not hold (``report.cards.advisor_charts``). Both are computed only when a record
    or a page is asked for."""

    def __init__(self, command: str, args: argparse.Namespace) -> None:
        self.command = command
        self.args = args
        self.started = time.time()
        # a record that cannot be written fails the command before it writes anything else
        for path in (getattr(args, "json", None), getattr(args, "report", None)):
            if path:
                output_dir(path)

    @property
    def wanted(self) -> bool:
        return bool(getattr(self.args, "json", None) or getattr(self.args, "report", None))

    def record(self, result: dict, *, models: dict | None = None, charts: dict | None = None):
        from modelpress.report.cards import model_card  # (the advisor, the profiler: onnx_ir)

        cards = {
            role: m if isinstance(m, dict) else model_card(m, name=role)
            for role, m in (models or {}).items()
            if m is not None
        }
        return Record.of(
            self.command, self.args, result, started=self.started, models=cards, charts=charts
        )

    def write(
        self, result: dict, *, models: dict | None = None, charts: dict | None = None
    ) -> None:
        path = getattr(self.args, "json", None)
        if path:
            self.record(result, models=models, charts=charts).write(path)
        self.write_page(result, models=models, charts=charts)

    def write_page(
        self, result: dict, *, models: dict | None = None, charts: dict | None = None
    ) -> None:
        """Only the page (``--report``): for a command whose ``--json`` still writes its own format."""
        page = getattr(self.args, "report", None)
        if not page:
            return
        from modelpress.report.page import write_report  # (matplotlib)

        record = self.record(result, models=models, charts=charts)
        write_report([record], page, title=f"modelpress {self.command}")
