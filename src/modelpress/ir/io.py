"""Load and save ONNX models.

Loading checks the file (exists, parses, passes the ONNX checker) and turns every failure into one
``ModelLoadError`` line that names the file. Beyond the checker, it refuses what would crash later:
external data that is missing, not a regular file, too short, or outside the model's folder (a
model file must not make modelpress read ``../../etc/passwd``); names that are not valid UTF-8; and
initializers whose data does not match their shape. Saving is atomic: the model (and its external-data file,
for models over the protobuf limit) is written into a temporary folder beside the target and then
renamed into place, so a failed save never leaves a partial file and never touches an existing one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
from google.protobuf.message import DecodeError

from modelpress.errors import ModelLoadError, ModelSaveError
from modelpress.ir.files import existing_file, staging_dir

# Protobuf refuses messages over 2 GiB; past this many bytes of weights, save them externally.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def load_proto(path: str | os.PathLike, *, check: bool = True) -> onnx.ModelProto:
    """Read an ONNX file (with its external data) into a ``ModelProto``, checking it."""
    p = existing_file(path, what="an .onnx file", error=ModelLoadError)
    try:
        proto = onnx.load(str(p), load_external_data=False)
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
    _check_names(proto.graph, p)
    _load_external_data(proto, p)
    _check_tensor_sizes(proto, p)
    if check:
        try:
            if proto.ByteSize() > EXTERNAL_DATA_THRESHOLD:
                onnx.checker.check_model(str(p))
            else:
                onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            raise ModelLoadError(f"{p}: invalid ONNX graph: {_first_line(exc)}") from None
    return proto


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph holds: initializers (dense and sparse) and tensor attributes, in
    subgraphs too."""
    for g in _graphs(graph):
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def _check_names(graph: onnx.GraphProto, p: Path) -> None:
    # ONNX is proto2: protobuf does not check that strings are UTF-8 and hands such a field back
    # as bytes, which every later step chokes on.
    for g in _graphs(graph):
        named = [*g.input, *g.output, *g.value_info, *g.initializer]
        names = [(f"value {v.name!r}", v.name) for v in named]
        for node in g.node:
            names.append((f"node {node.name!r}", node.name))
            names += [(f"a value of node {node.name!r}", n) for n in (*node.input, *node.output)]
            names.append((f"the op type of node {node.name!r}", node.op_type))
        for what, name in names:
            if isinstance(name, bytes):
                raise ModelLoadError(
                    f"{p}: {what.replace(repr(name), repr(name.decode('utf-8', 'replace')))} "
                    "has a name that is not valid UTF-8"
                )


def _load_external_data(proto: onnx.ModelProto, p: Path) -> None:
    """Read the external data of every tensor, after checking where it points."""
    folder = p.resolve().parent
    for tensor in _tensors(proto.graph):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        where = f"{p}: initializer {tensor.name!r}"
        location = info.location or ""
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(folder):
            raise ModelLoadError(
                f"{where}: its external data {location!r} is outside the model's folder; "
                "external data must sit beside the model"
            )
        if not target.is_file():
            raise ModelLoadError(f"{where}: its external data file {location!r} is missing")
        offset = info.offset or 0
        size = target.stat().st_size
        length = info.length if info.length is not None else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelLoadError(
                f"{where}: its external data ({location!r}, offset {offset}, length {length}) "
                f"runs past the end of the file ({size} bytes); is the file truncated?"
            )
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(folder))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{p}: its external data could not be read: {_first_line(exc)}"
        ) from None


# Values each typed field stores per element (complex numbers take two).
_TYPED_FIELDS = {
    onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.FLOAT: ("float_data", 1),
    onnx.TensorProto.DOUBLE: ("double_data", 1),
    onnx.TensorProto.INT64: ("int64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1),
    onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.STRING: ("string_data", 1),
}
_INT32_FIELD = {
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.BOOL,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}

_SUB_BYTE = {
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
}


def _check_tensor_sizes(proto: onnx.ModelProto, p: Path) -> None:
    """Each tensor's data holds exactly the elements its shape says (sub-byte types aside)."""
    for tensor in _tensors(proto.graph):
        if tensor.data_type == onnx.TensorProto.UNDEFINED:
            continue
        if any(d < 0 for d in tensor.dims):
            raise ModelLoadError(
                f"{p}: initializer {tensor.name!r} has a negative dimension {list(tensor.dims)}"
            )
        want = math.prod(tensor.dims)
        if tensor.HasField("raw_data"):
            if tensor.data_type in _SUB_BYTE:
                continue  # packed two or four to a byte
            try:
                unit = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
            except (KeyError, TypeError, ValueError):
                continue
            have = len(tensor.raw_data)
            if have != want * unit:
                raise ModelLoadError(
                    f"{p}: initializer {tensor.name!r} holds {have} bytes of data, its shape "
                    f"{list(tensor.dims)} needs {want * unit}; the file is damaged"
                )
        elif tensor.data_type in _TYPED_FIELDS or tensor.data_type in _INT32_FIELD:
            field, per = _TYPED_FIELDS.get(tensor.data_type, ("int32_data", 1))
            have = len(getattr(tensor, field))
            if have and have != want * per:
                raise ModelLoadError(
                    f"{p}: initializer {tensor.name!r} holds {have // per} values, its shape "
                    f"{list(tensor.dims)} needs {want}; the file is damaged"
                )


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
    proto = load_proto(path, check=check)
    try:
        return from_proto(proto)
    except Exception as exc:  # noqa: BLE001 - onnx_ir wraps what it cannot read in its own errors
        cause = exc.__cause__ or exc
        raise ModelLoadError(f"{path}: cannot be read into memory: {_first_line(cause)}") from None


def from_bytes(data: bytes, *, source: str = "the model data") -> ir.Model:
    """A model from its serialized bytes (a model decoded in memory: never written to disk)."""
    try:
        proto = onnx.load_from_string(bytes(data))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{source}: not a valid ONNX model ({_first_line(exc)})") from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{source}: not an ONNX model (no graph)")
    return from_proto(proto)


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


def _save_staged(
    proto, p: Path, tmpdir: Path, data_name: str, external_data: bool, size_threshold: int
) -> None:
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
