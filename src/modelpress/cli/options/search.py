"""What a search (``auto``, ``deploy``) may spend: accuracy and time."""

from __future__ import annotations

import argparse
import re

from modelpress.cli.options.command import add_with_default, keywords
from modelpress.errors import OptionError

_UNITS = {"s": 1, "m": 60, "h": 3600}


def add_search_budget(p: argparse.ArgumentParser, *, drop: str, time: str) -> None:
    """What a search (``auto``, ``deploy``) may spend: accuracy (``--max-accuracy-drop``, a fraction
    of the metric) and time (``--time-budget``, a duration)."""
    add_with_default(p, "--max-accuracy-drop", type=float, default=0.01, metavar="X", help=drop)
    add_with_default(p, "--time-budget", default="10m", metavar="DURATION", help=time)


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``10m``, ``1h30m``, ``1.5h``."""
    t = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise OptionError(f"--time-budget {text}: write a duration such as 90s, 10m or 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise OptionError(f"--time-budget {text}: must be more than 0")
    return seconds


def search_args(args: argparse.Namespace) -> dict:
    """The library's keywords for a search's options: its samples (``--data``, ``--labels-key``),
    its budget (``add_search_budget``) and whether candidates may train (``--no-train``)."""
    return {
        **keywords(args, "data", "labels_key", "max_accuracy_drop"),
        "time_budget_s": parse_duration(args.time_budget),
        "train": not args.no_train,
    }
