"""What a search (``auto``, ``deploy``) may spend: accuracy and time."""

from __future__ import annotations

import argparse

from modelpress.cli.options.command import add_with_default


def add_search_budget(p: argparse.ArgumentParser, *, drop: str, time: str) -> None:
    """What a search (``auto``, ``deploy``) may spend: accuracy (``--max-accuracy-drop``, a fraction
    of the metric) and time (``--time-budget``, a duration)."""
    add_with_default(p, "--max-accuracy-drop", type=float, default=0.01, metavar="X", help=drop)
    add_with_default(p, "--time-budget", default="10m", metavar="DURATION", help=time)
