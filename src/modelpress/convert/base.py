"""The converter registry, the options every converter reads, and what a converter hands back.

A *source kind* (``pt2``, ``torchscript``, ``savedmodel``, ...) is registered with a function that
says whether it accepts a source (a path or an in-memory model) and a function that converts it.
``detect()`` walks the registry in order; the first kind that accepts the source wins, so a new
framework is one more row in ``kinds.FRAMEWORK_KINDS`` and nothing else changes.

A converter returns an ``Exported``: the ONNX model plus a ``reference`` callable that runs the
*original* framework on numpy feeds (keyed by ONNX input name), which is what verification compares
against, and the concrete input shapes the model was traced at.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import ConversionError, OptionError  # noqa: F401  (the converters raise it)


@dataclass(frozen=True)
class InputSpec:
    """A shape (and dtype) given for one input (``--shape name=1x3x32x32[:dtype]`` on the command line)."""

    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class ConvertOptions:
    opset: int | None = None
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    dynamic: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input name -> axes
    example_inputs: tuple | dict | None = None  # for in-memory models
    # Let the exporter run its own graph clean-up (onnxscript's optimizer for the dynamo exporter,
    # constant folding for the TorchScript one). Off, the ONNX graph mirrors the source op for op.
    exporter_optimizations: bool = True


@dataclass
class Exported:
    """What a converter produced, before verification."""

    model: ir.Model
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]]
    shapes: dict[str, tuple[int, ...]]  # concrete shape per ONNX input used to trace the model
    exporter: str
    dynamic: list[tuple[str, int]] = field(default_factory=list)  # (input, axis) that may vary
    example_feeds: dict[str, np.ndarray] | None = None  # real inputs the user gave, if any
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SourceKind:
    name: str
    description: str
    extra: str  # the optional extra this kind needs
    accepts: Callable[[object], bool]
    convert: Callable[[object, ConvertOptions], Exported]
    llm: bool = False  # a decoder checkpoint: converted to an LLM folder by ``convert.llm``


SOURCE_KINDS: dict[str, SourceKind] = {}


def register(
    name: str,
    *,
    description: str,
    extra: str,
    accepts: Callable[[object], bool],
    llm: bool = False,
) -> Callable[[Callable[[object, ConvertOptions], Exported]], Callable]:
    """Register ``fn(source, options) -> Exported`` as the converter of source kind ``name``
    (``llm=True``: a decoder checkpoint, which ``convert()`` hands to ``convert.llm`` instead)."""

    def wrap(fn):
        SOURCE_KINDS[name] = SourceKind(name, description, extra, accepts, fn, llm)
        return fn

    return wrap


def has_suffix(*suffixes: str) -> Callable[[object], bool]:
    def accepts(source: object) -> bool:
        return (
            isinstance(source, (str, os.PathLike))
            and Path(source).is_file()
            and Path(source).suffix.lower() in suffixes
        )

    return accepts


_DTYPES = {"float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"}


def parse_input_specs(specs: list[str] | None) -> dict[str, InputSpec]:
    """Parse ``["x=1x3x32x32", "ids=2x16:int64"]`` into ``{name: InputSpec}``."""
    out: dict[str, InputSpec] = {}
    for spec in specs or []:
        m = re.fullmatch(r"([^=]+)=([0-9x]*)(?::(\w+))?", spec.strip())
        if not m:
            raise OptionError(
                f"`inputs` {spec!r}: expected NAME=D1xD2x...[:DTYPE], e.g. x=1x3x224x224"
            )
        name, dims, dtype = m.group(1), m.group(2), m.group(3) or "float32"
        if dtype not in _DTYPES:
            raise OptionError(
                f"`inputs` {spec!r}: unknown dtype {dtype!r} (one of {', '.join(sorted(_DTYPES))})"
            )
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise OptionError(
                f"`inputs` {spec!r}: dimensions must be integers joined by 'x'"
            ) from None
        out[name] = InputSpec(shape, dtype)
    return out


def parse_dynamic(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``["x:0", "ids:1"]`` into ``{name: (axes...)}``."""
    out: dict[str, list[int]] = {}
    for spec in specs or []:
        name, sep, axis = spec.rpartition(":")
        if not sep or not name or not axis.lstrip("-").isdigit():
            raise OptionError(f"`dynamic` {spec!r}: expected NAME:AXIS, e.g. x:0")
        out.setdefault(name, []).append(int(axis))
    return {k: tuple(v) for k, v in out.items()}


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first meaningful line of an exception's message (exporters write pages)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return type(exc).__name__


@contextlib.contextmanager
def reading(path: object, what: str, hint: str = "") -> Iterator[None]:
    """Turn whatever a framework raises while opening ``path`` into one ConversionError line:
    ``<path>: not a readable <what> (<its first line>)<hint>``."""
    try:
        yield
    # The frameworks raise many types for a bad file; each becomes one line.
    except Exception as exc:
        raise ConversionError(
            f"{path}: not a readable {what} ({first_line(exc, 200)}){hint}"
        ) from None
