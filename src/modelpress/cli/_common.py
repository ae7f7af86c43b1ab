"""Helpers shared by the subcommands: console, number formatting, JSON records."""

from __future__ import annotations

import os

from rich.console import Console

from modelpress.ir.files import write_json as write

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


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
