"""The registry of the dependency analysis's op rules (``rules/``): ``RULES[op_type]`` is
``fn(analyzer, node)``; a rule that cannot follow its tracked inputs raises ``Refuse``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import onnx_ir as ir

if TYPE_CHECKING:
    from modelpress.compress.prune.analyzer import Analyzer


class Refuse(Exception):
    """The rule cannot follow its tracked inputs; they are blocked."""


RULES: dict[str, Callable[[Analyzer, ir.Node], None]] = {}


def rule(*ops: str):
    def register(fn):
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def norm_axis(axis: int, rank: int) -> int:
    """``axis`` counted from the front (ONNX allows ``-rank <= axis < 0``)."""
    return axis + rank if axis < 0 else axis
