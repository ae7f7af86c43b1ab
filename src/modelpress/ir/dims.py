"""Dimensions: which are static, and the name of a symbolic one.

A dimension is *static* only when it is a positive integer. Exporters write dynamic dimensions as a
name (``batch``), as nothing at all, as ``-1`` (Paddle) or as ``0``: none of those constrains the
size of an input a user gives (``static_dim`` says which is which). A declared 0 is still what
ONNX Runtime enforces, so inputs generated for it keep the 0.

Plain Python (no onnx, no onnx_ir): the server checks requests with it on every call.
"""

from __future__ import annotations

# Names exporters write for "unknown", not for a dimension two inputs share: paddle2onnx and others
# write every unknown dimension as "?", so two of them are not one dimension.
ANONYMOUS_NAMES = frozenset({"?", "-1", "None", "unknown"})


def dim_name(dim: object) -> str | None:
    """The name of a symbolic dimension (``batch``), None for a fixed or an anonymous one."""
    value = getattr(dim, "value", dim if isinstance(dim, str) else None)
    if not isinstance(value, str) or not value or value in ANONYMOUS_NAMES:
        return None
    return value


def static_dim(dim: object) -> int | None:
    """The size of a dimension when it is fixed (a positive integer), else None (dynamic)."""
    if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
        return dim
    return None
