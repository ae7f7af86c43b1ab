"""Inputs for running a model: generated ones that respect dtypes and valid ranges, or a user's .npz.

Generated inputs follow three rules:
- a dynamic dimension takes the size the user gave for its name (``dims={"batch": 8}``), else
  ``default_dim``;
- an integer input that feeds (through Cast/Reshape/Unsqueeze/...) the indices of a Gather on a
  constant table stays inside that table, so embedding look-ups are valid;
- other integer inputs take 0 or 1 (attention masks, token types), booleans are random, floats are
  standard normal.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError
from modelpress.ir.feeds import numpy_dtype

# Ops that pass index values through unchanged, so a bound found behind them still applies.
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose"}


def resolve_shape(value: ir.Value, dims: dict[str, int], default_dim: int) -> tuple[int, ...]:
    if value.shape is None:
        raise InputError(
            f"input {value.name!r} has no declared shape: pass it in an .npz file instead"
        )
    shape = []
    for d in value.shape:
        if isinstance(d, int):
            shape.append(d)
        else:
            shape.append(dims.get(str(d.value), default_dim) if d.value else default_dim)
    return tuple(shape)


def _index_bound(value: ir.Value, depth: int = 0) -> int | None:
    """Smallest table size among the constant-table Gathers this value indexes, if any."""
    bound = None
    for node, idx in value.uses():
        b = None
        if node.op_type in ("Gather", "GatherElements") and idx == 1 and node.domain == "":
            data = node.inputs[0]
            if data is not None and data.shape is not None:
                axis = node.attributes.get_int("axis", 0)
                rank = len(data.shape)
                dim = data.shape[axis % rank] if rank else None
                if isinstance(dim, int):
                    b = dim
        elif node.op_type in _PASS_THROUGH and idx == 0 and depth < 4:
            b = _index_bound(node.outputs[0], depth + 1)
        if b is not None:
            bound = b if bound is None else min(bound, b)
    return bound


def generate_inputs(
    model: ir.Model,
    *,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    default_dim: int = 2,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """One random input per graph input (initializers that double as inputs are skipped)."""
    dims = dims or {}
    shapes = shapes or {}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.inputs:
        if value.name in model.graph.initializers:
            continue
        dtype = numpy_dtype(value)
        shape = shapes.get(value.name) or resolve_shape(value, dims, default_dim)
        if dtype == np.bool_:
            arr = rng.random(shape) > 0.5
        elif np.issubdtype(dtype, np.integer):
            high = _index_bound(value) or 2
            arr = rng.integers(0, max(high, 1), size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape).astype(dtype)
        else:
            raise InputError(
                f"input {value.name!r} has dtype {value.dtype}, which cannot be generated: "
                "pass inputs in an .npz file"
            )
        feeds[value.name] = arr
    return feeds
