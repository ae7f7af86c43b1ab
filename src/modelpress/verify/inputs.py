"""Inputs for running a model: generated ones that respect dtypes and valid ranges, or a user's .npz.

Generated inputs follow these rules:
- a dynamic dimension (a name, nothing or ``-1``: see ``ir.shapes.static_dim``) takes the size the
  user gave for its name (``dims={"batch": 8}``), else ``default_dim``; a declared ``0`` is
  generated as 0, since ONNX Runtime reads it literally (user inputs may have any size there);
- a set of inputs larger than ``MAX_INPUT_BYTES`` is refused before anything is allocated (a
  declared dimension of 10**9 would otherwise ask for terabytes);
- an integer input that feeds (through Cast/Reshape/Unsqueeze/...) the indices of a Gather on a
  constant table stays inside that table, so embedding look-ups are valid;
- an integer scalar that the graph compares (Equal, Less, Greater, ..., through Cast and the like)
  against constants takes the first of those constants: a sample rate that selects a branch
  (``If(sr == 16000)``) gets a value the model was written for, not a random one;
- other integer inputs take 0 or 1 (attention masks, token types), booleans are random, floats are
  standard normal.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError
from modelpress.ir.feeds import numpy_dtype
from modelpress.ir.match import COMPARISONS, const_array
from modelpress.ir.shapes import dim_name, static_dim

# The most memory one generated input set may take.
MAX_INPUT_BYTES = 1 << 30

# Ops that pass index values through unchanged, so a bound found behind them still applies.
_PASS_THROUGH = {
    "Cast",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "Identity",
    "Expand",
    "Transpose",
}


def resolve_shape(
    value: ir.Value, dims: dict[str, int], default_dim: int | None = None, *, free=None
) -> tuple[int, ...]:
    """The concrete shape to generate for ``value``: fixed dimensions as declared, named ones from
    ``dims``, the rest from ``free(axis, name)`` or else ``default_dim``."""
    if value.shape is None:
        raise InputError(f"input {value.name!r} has no declared shape: give real inputs (`inputs`)")
    shape = []
    for axis, d in enumerate(value.shape):
        size = 0 if d == 0 and isinstance(d, int) else static_dim(d)
        if size is None:
            name = dim_name(d)
            if name is not None and name in dims:
                size = dims[name]
            elif free is not None:
                size = free(axis, name)
            else:
                size = default_dim
        shape.append(size)
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


# Comparisons whose constant operand says which values an integer input is meant to take.


def compared_constants(value: ir.Value, depth: int = 0) -> list[int]:
    """The constant scalars ``value`` is compared against, in graph order (first use first)."""
    found: list[int] = []
    for node, idx in value.uses():
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in COMPARISONS and len(node.inputs) == 2:
            const = const_array(node.inputs[1 - idx])
            if const is not None and const.size == 1 and np.issubdtype(const.dtype, np.number):
                c = const.reshape(()).item()
                if float(c).is_integer() and int(c) not in found:
                    found.append(int(c))
        elif node.op_type in _PASS_THROUGH and idx == 0 and depth < 4:
            for c in compared_constants(node.outputs[0], depth + 1):
                if c not in found:
                    found.append(c)
    return found


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
    planned = planned_shapes(model, dims=dims, shapes=shapes, default_dim=default_dim)
    for value in model.graph.inputs:
        if value.name not in planned:
            continue
        dtype = numpy_dtype(value)
        shape = planned[value.name]
        if dtype == np.bool_:
            arr = rng.random(shape) > 0.5
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            constants = [
                c
                for c in (compared_constants(value) if int(np.prod(shape)) == 1 else [])
                if info.min <= c <= info.max
            ]
            if constants:
                arr = np.full(shape, constants[0], dtype=dtype)
            else:
                high = _index_bound(value) or 2
                arr = rng.integers(0, max(high, 1), size=shape).astype(dtype)
        elif dtype in (np.float32, np.float64):
            arr = rng.standard_normal(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        else:
            raise InputError(
                f"input {value.name!r} has dtype {value.dtype}, which cannot be generated: "
                "pass inputs in an .npz file"
            )
        feeds[value.name] = arr
    return feeds


def planned_shapes(
    model: ir.Model,
    *,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    default_dim: int = 2,
    free=None,
    max_bytes: int = MAX_INPUT_BYTES,
) -> dict[str, tuple[int, ...]]:
    """The shape each graph input will be generated at; ``InputError`` before any allocation when
    the set would pass ``max_bytes`` (or a dimension is negative).

    ``free(value, axis, name)``, when given, sizes the dynamic dimensions ``dims`` does not name.
    """
    dims = dims or {}
    shapes = shapes or {}
    out: dict[str, tuple[int, ...]] = {}
    total = 0
    for value in model.graph.inputs:
        if value.name in model.graph.initializers:
            continue
        sizer = (lambda axis, name, v=value: free(v, axis, name)) if free else None
        shape = tuple(shapes.get(value.name) or resolve_shape(value, dims, default_dim, free=sizer))
        if any(d < 0 for d in shape):
            raise InputError(f"input {value.name!r}: negative size in shape {list(shape)}")
        nbytes = int(np.prod(shape, dtype=np.float64)) * numpy_dtype(value).itemsize
        total += nbytes
        if total > max_bytes:
            raise InputError(
                f"input {value.name!r} would take {_human(nbytes)} at shape {list(shape)}, over the "
                f"{_human(max_bytes)} a generated input set may use: give real inputs (`inputs`) "
                "or smaller sizes (`dims`, `shapes`)"
            )
        out[value.name] = shape
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"
