"""Errors of the PyTorch backend."""

from __future__ import annotations

from modelpress.errors import InputError, ModelpressError


class UnsupportedOpError(ModelpressError):
    """A node whose operator (or operator variant) the PyTorch backend does not implement."""


class NodeRunError(InputError):
    """A node failed while running (usually inputs whose shapes or values the graph cannot take)."""
