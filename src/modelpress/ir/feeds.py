"""What a model is given: models in any form modelpress accepts, and the arrays fed to them
(checked against the model's inputs; read from ``.npz`` files)."""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError
from modelpress.ir.files import existing_file
from modelpress.ir.io import from_proto, load
from modelpress.ir.shapes import static_dim


def as_model(model) -> ir.Model:
    """``model`` as an ``onnx_ir.Model``: itself, a ``ModelProto`` converted, or a path loaded."""
    if isinstance(model, ir.Model):
        return model
    if hasattr(model, "SerializeToString"):
        return from_proto(model)
    return load(model)


def numpy_dtype(value: ir.Value) -> np.dtype:
    if value.dtype is None:
        return np.dtype(np.float32)
    return np.dtype(value.dtype.numpy())


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name, or one ``InputError`` line saying what is wrong."""
    p = existing_file(path, what="an .npz file")
    try:
        data = np.load(p, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise InputError(
                f"{p}: a single array (.npy), expected an .npz of arrays named after the model's "
                "inputs (numpy.savez(path, input_name=array, ...))"
            )
        with data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"{p}: not a readable .npz file ({reason}); is it truncated?") from None


def check_feeds(model: ir.Model, feeds: dict[str, np.ndarray], *, source: str = "inputs") -> None:
    """Raise InputError when ``feeds`` misses an input, or has a wrong name, dtype or rank."""
    expected = {v.name: v for v in model.graph.inputs if v.name not in model.graph.initializers}
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        raise InputError(
            f"{source}: {unknown[0]!r} is not an input of the model (inputs: {', '.join(expected)})"
        )
    for name, value in expected.items():
        if name not in feeds:
            raise InputError(f"{source}: missing input {name!r}")
        arr = feeds[name]
        want = numpy_dtype(value)
        if arr.dtype != want:
            raise InputError(
                f"{source}: input {name!r} has dtype {arr.dtype}, the model expects {want}"
            )
        if value.shape is not None and arr.ndim != len(value.shape):
            raise InputError(
                f"{source}: input {name!r} has rank {arr.ndim} (shape {list(arr.shape)}), "
                f"the model expects rank {len(value.shape)}"
            )
        if value.shape is not None:
            for axis, (got, dim) in enumerate(zip(arr.shape, value.shape)):
                if static_dim(dim) is not None and got != dim:  # -1, 0, names: any size
                    raise InputError(
                        f"{source}: input {name!r} has size {got} on axis {axis}, the model expects {dim}"
                    )
