"""The source kinds ``convert`` accepts: the registry (``base.SOURCE_KINDS``) filled by the
framework modules, which register their kind on import (they import their framework lazily, so
importing them here costs nothing), and the detection of a source's kind."""

from __future__ import annotations

import os
from pathlib import Path

from modelpress.convert import tensorflow, tflite, torch  # noqa: F401  (register their kinds)
from modelpress.convert.base import SOURCE_KINDS, SourceKind
from modelpress.convert.llm import source as _llm_source  # noqa: F401  (decoder checkpoints)
from modelpress.errors import ConversionError


def detect(source: object) -> SourceKind:
    """The source kind of a path or in-memory model, or a ConversionError saying what is accepted."""
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if not p.exists():
            raise ConversionError(f"{p}: no such file or directory")
        if p.suffix.lower() == ".onnx":
            raise ConversionError(
                f"{p}: already an ONNX model; use `modelpress optimize` or `modelpress inspect` on it"
            )
    for kind in SOURCE_KINDS.values():
        if kind.accepts(source):
            return kind
    accepted = "; ".join(f"{k.description}" for k in SOURCE_KINDS.values())
    what = str(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__
    raise ConversionError(f"{what}: not a model modelpress can convert (accepted: {accepted})")


__all__ = ["SOURCE_KINDS", "detect"]
