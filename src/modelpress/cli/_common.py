"""Helpers shared by the subcommands: console, notes, progress bars, number formatting, JSON
records."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modelpress.errors import VerificationError
from modelpress.ir.files import write_json as write

# Piped or captured output has no width: rich would assume 80 columns and wrap lines and cut
# tables there (a path in a log split in two, a table's last columns lost). Lines then keep their
# length and tables their natural width, up to PIPED_WIDTH; COLUMNS still wins when set.
PIPED_WIDTH = 1000


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    if tty or os.environ.get("COLUMNS"):
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, width=PIPED_WIDTH, soft_wrap=True)


console = _console(stderr=False)
err_console = _console(stderr=True)


def heading(text: str) -> None:
    """A section title: a rule across a terminal, one plain line in a pipe."""
    if console.is_terminal:
        console.rule(text)
    else:
        console.print(f"── {text} ──")


def print_notes(notes, *, to: Console = console) -> None:
    """A result's notes, one ``note:`` line each (escaped: a note is text, never markup)."""
    for note in notes:
        to.print(f"note: {escape(note)}")


def transient_bar(*columns, to: Console = console) -> Progress:
    """A progress bar of ``columns`` that goes away when done (the output keeps the results)."""
    return Progress(*columns, console=to, transient=True)


def human_count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def human_bytes(n: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def write_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` as JSON atomically."""

    write(path, data)


def refuse_unless_kept(args, failures: list[str], record: dict, recorder, **cards) -> None:
    """A result that failed its check is not written unless --keep-anyway: ``VerificationError``,
    after writing the command's record (``recorder.write``, with ``cards``) with nothing written."""
    if failures and not args.keep_anyway:
        recorder.write({**record, "written": None}, **cards)
        raise VerificationError(
            f"{args.output} not written: {'; '.join(failures)} (--keep-anyway writes it regardless)"
        )


@contextmanager
def counted(label: str) -> Iterator[Callable[[int, int | None], None]]:
    """A transient bar titled ``label`` while a library call runs; yields the ``progress(done,
    total)`` callback to hand to it."""
    with transient_bar(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
