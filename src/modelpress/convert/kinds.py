"""The source kinds ``convert`` accepts, and the detection of a source's kind.

The registry (``base.SOURCE_KINDS``) holds the framework kinds of the table below and the decoder
checkpoints that ``convert.llm.source`` registers. The framework modules import their framework
lazily, so importing them here costs nothing; a new framework is one more row.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelpress.convert import tensorflow, tflite, torch
from modelpress.convert.base import SOURCE_KINDS, SourceKind, has_suffix
from modelpress.convert.llm import source as _llm_source  # noqa: F401  (decoder checkpoints)
from modelpress.errors import ConversionError

# name, description, extra, accepts, convert; the Python API's in-memory models first.
FRAMEWORK_KINDS = (
    SourceKind(
        "torch-module",
        "a torch.nn.Module with example_inputs (Python API)",
        "torch",
        torch.is_module,
        torch.convert_module,
    ),
    SourceKind(
        "keras-model",
        "a keras.Model (Python API)",
        "tensorflow",
        tensorflow.is_keras_model,
        tensorflow.convert_keras_model,
    ),
    SourceKind(
        "pt2", "a torch.export program (.pt2)", "torch", has_suffix(".pt2"), torch.convert_pt2
    ),
    SourceKind(
        "torchscript",
        "a TorchScript module (.pt, .pth, with input shapes)",
        "torch",
        has_suffix(".pt", ".pth", ".ptl"),
        torch.convert_torchscript,
    ),
    SourceKind(
        "keras",
        "a Keras model file (.keras, .h5)",
        "tensorflow",
        has_suffix(".keras", ".h5", ".hdf5"),
        tensorflow.convert_keras_file,
    ),
    SourceKind(
        "savedmodel",
        "a TensorFlow SavedModel directory (with a signature)",
        "tensorflow",
        tensorflow.is_saved_model,
        tensorflow.convert_saved_model,
    ),
    SourceKind(
        "tflite",
        "a TensorFlow Lite flatbuffer (.tflite)",
        "tensorflow",
        has_suffix(".tflite"),
        tflite.convert_tflite,
    ),
)
# The framework kinds lead: detection and the listings (`convert --help`) walk the registry in
# order, and the decoder checkpoints registered themselves on import.
_decoders = dict(SOURCE_KINDS)
SOURCE_KINDS.clear()
SOURCE_KINDS.update({kind.name: kind for kind in FRAMEWORK_KINDS} | _decoders)


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


__all__ = ["FRAMEWORK_KINDS", "SOURCE_KINDS", "detect"]
