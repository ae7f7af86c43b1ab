"""Load and save ONNX models.

Loading checks the file (exists, parses, passes the ONNX checker) and turns every failure into one
``ModelLoadError`` line that names the file. Saving is atomic: the model (and its external-data file,
for models over the protobuf limit) is written into a temporary folder beside the target and then
renamed into place, so a failed save never leaves a partial file and never touches an existing one.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
from google.protobuf.message import DecodeError

from modelpress.errors import ModelLoadError, ModelSaveError
from modelpress.ir.files import staging_dir

# Protobuf refuses messages over 2 GiB; past this many bytes of weights, save them externally.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def load_proto(path: str | os.PathLike, *, check: bool = True) -> onnx.ModelProto:
    """Read an ONNX file (with its external data) into a ``ModelProto``, checking it."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file")
    if p.is_dir():
        raise ModelLoadError(f"{p}: is a directory, expected an .onnx file")
    try:
        proto = onnx.load(str(p), load_external_data=True)
    except DecodeError as exc:
        raise ModelLoadError(
            f"{p}: not a valid ONNX file (protobuf parse failed: {_first_line(exc)}); "
            "is it truncated or of another format?"
        ) from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{p}: could not be read: {_first_line(exc)}") from None
    # Protobuf parses many non-ONNX byte strings into an empty message; an ONNX model has a graph.
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelLoadError(f"{p}: not an ONNX model (no graph found in the file)")
    if not proto.opset_import:
        raise ModelLoadError(f"{p}: not a valid ONNX model (no opset_import)")
    if check:
        try:
            if proto.ByteSize() > EXTERNAL_DATA_THRESHOLD:
                onnx.checker.check_model(str(p))
            else:
                onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            raise ModelLoadError(f"{p}: invalid ONNX graph: {_first_line(exc)}") from None
    return proto


def from_proto(proto: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(proto)


def invalid(model: ir.Model) -> str | None:
    """Why ``model`` is not a valid ONNX model (the checker with full shape and type inference,
    as ONNX Runtime's loader applies them), or None when it is (or too large to check in
    memory)."""
    proto = to_proto(model)
    if _approx_size(proto) > EXTERNAL_DATA_THRESHOLD:
        return None
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return _first_line(exc)
    return None


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def parse(text: str) -> ir.Model:
    """A model from ONNX's textual syntax (``<ir_version: 8, opset_import: ["" : 17]> g (...) => (...) {...}``)."""
    try:
        return from_proto(onnx.parser.parse_model(text))
    except (onnx.parser.ParseError, ValueError) as exc:
        raise ModelLoadError(f"not a model in ONNX's text format: {_first_line(exc)}") from None


def load(path: str | os.PathLike, *, check: bool = True) -> ir.Model:
    """Load an ONNX file into the in-memory IR (``onnx_ir.Model``)."""
    return from_proto(load_proto(path, check=check))


def model_bytes(model: ir.Model | onnx.ModelProto) -> bytes:
    """The serialized model, for models under the protobuf limit (sessions, hashing, sizes)."""
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(model)
    return proto.SerializeToString()


def save(
    model: ir.Model | onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    size_threshold: int = 1024,
) -> Path:
    """Write ``model`` to ``path`` atomically and return the path.

    ``external_data=None`` stores weights externally (in ``<name>.data`` beside the model) only when
    the model would pass the protobuf limit; ``True`` forces it, storing every tensor of at least
    ``size_threshold`` bytes outside the file.
    """
    p = Path(path)
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(model)
    if external_data is None:
        external_data = _approx_size(proto) > EXTERNAL_DATA_THRESHOLD
    data_name = p.name + ".data"
    with staging_dir(p) as tmpdir:
        _save_staged(proto, p, tmpdir, data_name, external_data, size_threshold)
    return p


def _save_staged(proto, p: Path, tmpdir: Path, data_name: str, external_data: bool, size_threshold: int) -> None:
    parent = p.parent if str(p.parent) else Path(".")
    try:
        tmp_model = tmpdir / p.name
        if external_data:
            # Work on a copy: convert_model_to_external_data mutates the proto it is given.
            proto_copy = onnx.ModelProto()
            proto_copy.CopyFrom(proto)
            _to_raw_data(proto_copy, size_threshold)
            onnx.save_model(
                proto_copy,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=size_threshold,
            )
        else:
            onnx.save_model(proto, str(tmp_model))
        tmp_data = tmpdir / data_name
        if tmp_data.exists():
            os.replace(tmp_data, parent / data_name)
        os.replace(tmp_model, p)
    except (OSError, ValueError) as exc:
        raise ModelSaveError(f"{p}: could not be written: {_first_line(exc)}") from None


def _to_raw_data(proto: onnx.ModelProto, size_threshold: int) -> None:
    # onnx moves only raw_data tensors to external files; typed fields (float_data, ...) stay inline.
    for t in proto.graph.initializer:
        if not t.HasField("raw_data") and t.data_location != onnx.TensorProto.EXTERNAL:
            arr = onnx.numpy_helper.to_array(t)
            if arr.nbytes >= size_threshold and arr.dtype != object:
                t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))


def _approx_size(proto: onnx.ModelProto) -> int:
    # ByteSize() itself overflows past 2 GiB on some protobuf builds; sum the initializers instead.
    total = 0
    for t in proto.graph.initializer:
        total += len(t.raw_data) if t.HasField("raw_data") else t.ByteSize()
        if total > EXTERNAL_DATA_THRESHOLD:
            break
    return total
