"""TensorFlow and Keras to ONNX with tf2onnx: SavedModel folders, ``.keras``/``.h5`` files, ``.tflite``.

- Keras models (files or in-memory ``keras.Model``) go through ``tf2onnx.convert.from_keras``, which
  keeps the Keras input and output names. Keras's own ``model.export(format="onnx")`` drives the
  same tf2onnx conversion on the TensorFlow backend, so it would add nothing but a file round trip.
- A SavedModel is converted through one of its signatures (``serving_default`` unless there is only
  another one): the ONNX inputs and outputs take the signature's argument and output names.
- ``.tflite`` files: see ``convert.tflite``.
tf2onnx rewrites ``tf.while_loop``/``tf.cond`` into ONNX ``Loop``/``If`` and Keras RNNs into
``LSTM``/``GRU`` where it recognises them. An op tf2onnx cannot map is left in the graph under its
TensorFlow name; ``_check_ops`` turns that into one error naming the op and the TF node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np

from modelpress.convert.base import (
    ConversionError,
    ConvertOptions,
    Exported,
    first_line,
    reading,
)
from modelpress.errors import OptionError, require
from modelpress.ir import from_proto
from modelpress.ir.stats import iter_nodes

# tf2onnx 1.17 knows opsets up to 18; 17 is what most runtimes support.
DEFAULT_OPSET = 17
DEFAULT_DIM = 2  # size given to a dimension a model leaves open (batch), unless `inputs` says


def _tf():
    # TensorFlow's C++ start-up logs flood stderr; this only sets a default the user can override.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return require("tensorflow", extra="tensorflow", purpose="converting a TensorFlow/Keras model")


def _tf2onnx():
    _tf()
    return require("tf2onnx", extra="tensorflow", purpose="converting a TensorFlow/Keras model")


@contextlib.contextmanager
def _quiet():
    loggers = [logging.getLogger(n) for n in ("tf2onnx", "tensorflow", "absl")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=False):
            lg.setLevel(level)


def is_keras_model(source: object) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(source, keras.Model)


def is_saved_model(source: object) -> bool:
    return isinstance(source, (str, os.PathLike)) and (Path(source) / "saved_model.pb").is_file()


def _to_ir(model_proto):

    return from_proto(model_proto)


def _check_ops(model, opset: int, source: str) -> None:
    """Raise ConversionError for a node tf2onnx left unconverted (a TF op type in the ONNX domain)."""
    import onnx.defs

    for node in iter_nodes(model.graph):
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
            raise ConversionError(
                f"{source}: unsupported TensorFlow op {node.op_type} (node {node.name!r}): tf2onnx has "
                f"no ONNX conversion for it at opset {opset}; try a newer `opset` (up to 18), "
                "replace the op in the model, or map it to a custom op (tf2onnx custom_ops)"
            )


def _spec_shape(name: str, shape, options: ConvertOptions) -> list[int | None]:
    """The shape to convert with: ``inputs`` overrides, ``dynamic`` opens axes."""
    dims = list(options.inputs[name].shape) if name in options.inputs else list(shape)
    for axis in options.dynamic.get(name, ()):
        if not -len(dims) <= axis < len(dims):
            raise OptionError(f"`dynamic` {name}:{axis}: input {name!r} has rank {len(dims)}")
        dims[axis] = None
    return dims


def _concrete(name: str, dims: list[int | None], options: ConvertOptions) -> tuple[int, ...]:
    given = options.inputs.get(name)
    if given is not None:
        return tuple(given.shape)
    return tuple(DEFAULT_DIM if d is None else int(d) for d in dims)


def _check_names(options: ConvertOptions, names: list[str], source: str) -> None:
    for option, given in (("`inputs`", options.inputs), ("`dynamic`", options.dynamic)):
        for name in given:
            if name not in names:
                raise OptionError(
                    f"{option} {name}: {source} has no input {name!r} (inputs: {', '.join(names)})"
                )


def _flatten(tf, outputs) -> list[np.ndarray]:
    return [np.asarray(t) for t in tf.nest.flatten(outputs)]


# ---------------------------------------------------------------------------------------------
# Keras


def _convert_keras(model, options: ConvertOptions, source: str) -> Exported:
    tf = _tf()
    tf2onnx = _tf2onnx()
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConversionError(
            f"{source}: the Keras model has no defined inputs (a Sequential model never called); "
            "build it with keras.Input(...) first"
        )
    names = [t.name for t in inputs]
    _check_names(options, names, source)
    dims = {n: _spec_shape(n, t.shape, options) for n, t in zip(names, inputs, strict=False)}
    specs = [tf.TensorSpec(dims[n], t.dtype, name=n) for n, t in zip(names, inputs, strict=False)]
    opset = options.opset or DEFAULT_OPSET
    try:
        with _quiet():
            proto, _ = tf2onnx.convert.from_keras(model, input_signature=specs, opset=opset)
    except Exception as exc:  # tf2onnx raises plain ValueErrors/KeyErrors for what it cannot map
        raise ConversionError(
            f"{source}: tf2onnx could not convert the Keras model: {first_line(exc)}"
        ) from None
    onnx_model = _to_ir(proto)
    _check_ops(onnx_model, opset, source)
    onnx_names = [v.name for v in onnx_model.graph.inputs]

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # ONNX input names are the Keras input names, in the same order.
        args = [tf.constant(feeds[n]) for n in onnx_names]
        out = model(args if len(args) > 1 else args[0], training=False)
        return _flatten(tf, out)

    return Exported(
        model=onnx_model,
        reference=reference,
        shapes={n: _concrete(n, dims[n], options) for n in names},
        exporter="tf2onnx",
    )


def _load_keras(path: Path):
    _tf()
    keras = require("keras", extra="tensorflow", purpose="converting a Keras model")
    with reading(path, "Keras model"), _quiet():
        return keras.models.load_model(str(path), compile=False)


def convert_keras_model(model, options: ConvertOptions) -> Exported:
    return _convert_keras(model, options, f"Keras model {model.name!r}")


def convert_keras_file(path, options: ConvertOptions) -> Exported:
    return _convert_keras(_load_keras(Path(path)), options, str(path))


# ---------------------------------------------------------------------------------------------
# SavedModel


def _signature(loaded, path: Path):
    sigs = dict(loaded.signatures)
    if not sigs:
        raise ConversionError(
            f"{path}: the SavedModel has no signatures, so its inputs are unknown; save it with "
            "tf.saved_model.save(obj, path, signatures=obj.__call__.get_concrete_function(...)) "
            "or convert the Keras model (.keras) instead"
        )
    name = "serving_default" if "serving_default" in sigs else sorted(sigs)[0]
    return name, sigs[name], sorted(sigs)


def convert_saved_model(path, options: ConvertOptions) -> Exported:
    tf = _tf()
    tf2onnx = _tf2onnx()
    path = Path(path)
    with reading(path, "SavedModel"), _quiet():
        loaded = tf.saved_model.load(str(path))
    sig_name, sig, all_sigs = _signature(loaded, path)
    arg_specs = sig.structured_input_signature[1]
    names = sorted(arg_specs)
    _check_names(options, names, str(path))
    dims = {n: _spec_shape(n, arg_specs[n].shape, options) for n in names}
    specs = [tf.TensorSpec(dims[n], arg_specs[n].dtype, name=n) for n in names]
    output_keys = (
        sorted(sig.structured_outputs) if isinstance(sig.structured_outputs, dict) else None
    )

    # Signatures take keyword arguments only; tf2onnx converts a function of positional ones.
    @tf.function(input_signature=specs)
    def positional(*args):
        out = sig(**dict(zip(names, args, strict=False)))
        return [out[k] for k in output_keys] if output_keys else out

    opset = options.opset or DEFAULT_OPSET
    try:
        with _quiet():
            proto, _ = tf2onnx.convert.from_function(positional, input_signature=specs, opset=opset)
    except Exception as exc:
        raise ConversionError(
            f"{path}: tf2onnx could not convert signature {sig_name!r}: {first_line(exc)}"
        ) from None
    model = _to_ir(proto)
    _check_ops(model, opset, str(path))
    if output_keys and len(output_keys) == len(model.graph.outputs):
        for value, key in zip(model.graph.outputs, output_keys, strict=False):
            value.name = key

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = sig(**{n: tf.constant(feeds[n]) for n in names})
        return [np.asarray(out[k]) for k in output_keys] if output_keys else _flatten(tf, out)

    notes = []
    if len(all_sigs) > 1:
        notes.append(f"converted signature {sig_name!r} (the SavedModel has {', '.join(all_sigs)})")
    return Exported(
        model=model,
        reference=reference,
        shapes={n: _concrete(n, dims[n], options) for n in names},
        exporter="tf2onnx",
        notes=notes,
    )
