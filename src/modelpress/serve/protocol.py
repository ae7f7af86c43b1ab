"""The Open Inference Protocol (KServe v2) over HTTP: tensors in and out of request bodies.

An inference request is a JSON object (``{"id", "inputs": [{"name", "datatype", "shape", "data"}],
"outputs": [{"name", "parameters"}], "parameters"}``). Triton's binary-tensor extension, which
``tritonclient.http`` uses by default, puts the JSON first and the raw tensor bytes after it: the
``Inference-Header-Content-Length`` header gives the JSON's length, and each input whose data is
binary says how many bytes it has (``parameters.binary_data_size``), in the order of ``inputs``.
Binary data is little-endian and row-major; a ``BYTES`` element is a 4-byte little-endian length
followed by that many bytes. Responses follow the same rules: an output is binary when its requested
output says ``binary_data``, or else when the request's ``binary_data_output`` parameter is set
(``tritonclient`` sets it when the client names no outputs).

Everything here is pure: bytes in, arrays out, and back. A malformed body raises ``RequestError``
(400) naming the field; checking the arrays against the model is the repository's job.

Hostile bodies. Nothing is allocated from a declared shape before the body is known to hold that
many elements: binary data must have exactly ``count x itemsize`` bytes, BYTES data at least 4
bytes an element, JSON data exactly ``count`` values; a dimension past ``MAX_DIM`` is refused. A
JSON header nested past Python's recursion limit, or a field of the wrong JSON type, is a 400.

Non-finite numbers. The KServe v2 protocol carries tensors in JSON, and JSON (RFC 8259) has no
NaN or infinity. Triton writes them as the bare tokens ``NaN``/``Infinity`` (rapidjson's
``kWriteNanAndInfFlag``), which strict JSON parsers refuse. This server writes them as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (protobuf's JSON mapping, which the v2 gRPC protocol
uses), which any JSON parser reads and ``numpy.array(data, dtype)`` (so ``tritonclient``'s
``as_numpy``) turns back into the numbers; binary outputs carry the IEEE bits as they are. In a
request it takes the same strings, or the bare tokens; a finite number outside the datatype's range
(``1e39`` as FP32) is refused, never rounded to infinity.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from modelpress.serve.errors import RequestError, json_object

# v2 datatype names and the numpy types they travel as (little-endian on the wire).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}


MAX_DIM = 2**31 - 1  # past any tensor a runtime allocates; zero-size tensors cannot declare more
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _bfloat16() -> np.dtype | None:
    try:
        import ml_dtypes  # shipped with onnx; only BF16 tensors need it
    except ImportError:  # pragma: no cover - onnx depends on it
        return None
    return np.dtype(ml_dtypes.bfloat16)


_BF16 = _bfloat16()
if _BF16 is not None:
    DATATYPES["BF16"] = _BF16


@functools.cache  # a handful of dtypes, asked for on every answer
def datatype_name(dtype: np.dtype) -> str:
    """The v2 name of a numpy dtype (``float32`` → ``FP32``); ``BYTES`` for strings and objects."""
    if dtype.kind in "OSU":
        return "BYTES"
    for name, dt in DATATYPES.items():
        if name != "BYTES" and dt == dtype.newbyteorder("<"):
            return name
    raise ValueError(f"no Open Inference Protocol datatype for {dtype}")


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None  # None: the request's default


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None  # None: every output of the model
    binary_output: bool = False  # for outputs whose own parameters do not say
    parameters: dict = field(default_factory=dict)


def decompress(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """The request body under its ``Content-Encoding`` (gzip or deflate, as tritonclient sends it),
    refusing anything that inflates past ``limit`` bytes (413)."""
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise RequestError(
            415, f"Content-Encoding {encoding!r} is not supported (use gzip or deflate)"
        )
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestError(400, f"the {encoding} body cannot be decompressed: {exc}") from None
    if len(out) > limit:
        raise RequestError(413, f"the decompressed body is larger than the limit of {limit} bytes")
    if not inflater.eof:
        raise RequestError(400, f"the {encoding} body is truncated")
    return out


CACHED_HEADER_BYTES = 4096  # request headers up to this are parsed once (see decode_request)


@dataclass(frozen=True)
class _Tensor:
    """An input as a request's JSON header declares it."""

    name: str
    datatype: str
    dtype: np.dtype
    shape: tuple[int, ...]
    size: int | None  # binary_data_size; None: the values are in ``data``
    data: object = None


@dataclass(frozen=True)
class _Header:
    """A request's JSON header, checked: everything but the binary tensors' bytes."""

    tensors: tuple[_Tensor, ...]
    id: str | None
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool
    parameters: dict

    def request(self, binary: memoryview | bytes) -> InferRequest:
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for t in self.tensors:
            if t.size is None:
                arrays[t.name] = _from_json(t.data, t.dtype, t.shape, t.name, t.datatype)
                continue
            if offset + t.size > len(binary):
                raise RequestError(
                    400,
                    f"input {t.name!r}: the body ends {offset + t.size - len(binary)} bytes before its binary data does (truncated request?)",
                )
            arrays[t.name] = _from_binary(
                binary[offset : offset + t.size], t.dtype, t.shape, t.name, t.datatype
            )
            offset += t.size
        if offset != len(binary):
            raise RequestError(
                400,
                f"the body has {len(binary) - offset} bytes of binary data that no input declares",
            )
        return InferRequest(
            inputs=arrays,
            id=self.id,
            outputs=list(self.outputs) if self.outputs is not None else None,
            binary_output=self.binary_output,
            parameters=dict(self.parameters),
        )


def decode_request(body: bytes, *, header_length: int | None = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON followed by binary tensors).

    A client sends the same JSON header with every request of a shape (only the binary tensors
    change), so a small header is parsed and checked once and kept (``CACHED_HEADER_BYTES``, the
    last 256): the next request with the same header bytes only slices its tensors out of the
    body. A JSON body without binary data is parsed every time."""
    if header_length is None:
        return _read_header(body).request(b"")
    if header_length < 0 or header_length > len(body):
        raise RequestError(
            400,
            f"Inference-Header-Content-Length is {header_length} but the body has only {len(body)} bytes",
        )
    header, binary = bytes(body[:header_length]), memoryview(body)[header_length:]
    if len(header) <= CACHED_HEADER_BYTES:
        return _cached_header(header).request(binary)
    return _read_header(header).request(binary)


@functools.lru_cache(maxsize=256)
def _cached_header(header: bytes) -> _Header:
    return _read_header(header)  # (a header that raises is not kept)


def _read_header(header: bytes) -> _Header:
    doc = json_object(header, "the request header")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(400, "the request has no 'inputs' list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, "'parameters' must be a JSON object")

    tensors: dict[str, _Tensor] = {}
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise RequestError(400, f"inputs[{i}] must be an object with a 'name'")
        name = tensor["name"]
        if name in tensors:
            raise RequestError(400, f"input {name!r} is given twice")
        tparams = _parameters(tensor, f"input {name!r}")
        if "shared_memory_region" in tparams:
            raise RequestError(400, f"input {name!r}: shared-memory tensors are not supported")
        dtype, shape = _datatype(tensor, name), _shape(tensor, name)
        size = tparams.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestError(
                    400, f"input {name!r}: binary_data_size must be a non-negative integer"
                )
            tensors[name] = _Tensor(name, tensor["datatype"], dtype, shape, size)
        elif "data" in tensor:
            tensors[name] = _Tensor(name, tensor["datatype"], dtype, shape, None, tensor["data"])
        else:
            raise RequestError(400, f"input {name!r} has neither 'data' nor binary_data_size")

    outputs = None
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise RequestError(400, "'outputs' must be a list")
        outputs = []
        for i, out in enumerate(doc["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise RequestError(400, f"outputs[{i}] must be an object with a 'name'")
            oparams = _parameters(out, f"output {out['name']!r}")
            if oparams.get("classification"):
                raise RequestError(
                    400, f"output {out['name']!r}: the classification extension is not supported"
                )
            if "shared_memory_region" in oparams:
                raise RequestError(
                    400, f"output {out['name']!r}: shared-memory tensors are not supported"
                )
            binary_flag = oparams.get("binary_data")
            outputs.append(
                RequestedOutput(out["name"], None if binary_flag is None else bool(binary_flag))
            )
    request_id = doc.get("id")
    return _Header(
        tensors=tuple(tensors.values()),
        id=str(request_id) if request_id is not None else None,
        outputs=tuple(outputs) if outputs is not None else None,
        binary_output=bool(params.get("binary_data_output", False)),
        parameters=params,
    )


def _parameters(entry: dict, where: str) -> dict:
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, f"{where}: 'parameters' must be a JSON object")
    return params


def _datatype(tensor: dict, name: str) -> np.dtype:
    datatype = tensor.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise RequestError(
            400, f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}"
        )
    return DATATYPES[datatype]


def _shape(tensor: dict, name: str) -> tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise RequestError(400, f"input {name!r}: 'shape' must be a list of non-negative integers")
    if len(shape) > 32 or any(d > MAX_DIM for d in shape):
        raise RequestError(
            400,
            f"input {name!r}: shape {shape} is beyond any tensor (at most 32 axes of {MAX_DIM})",
        )
    return tuple(shape)


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(
        shape
    )  # Python ints: no overflow for absurd shapes, and no numpy call per request


def _from_binary(buf: memoryview, dtype: np.dtype, shape, name: str, datatype: str) -> np.ndarray:
    count = _count(shape)
    if datatype == "BYTES":
        return _bytes_elements(buf, count, name).reshape(shape)
    if len(buf) != count * dtype.itemsize:
        raise RequestError(
            400,
            f"input {name!r}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
            f"binary_data_size is {len(buf)}",
        )
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    if not arr.flags.aligned:  # the header's length puts the data anywhere; kernels want alignment
        arr = arr.copy()
    return arr.astype(dtype.newbyteorder("="), copy=False)


def _bytes_elements(buf: memoryview, count: int, name: str) -> np.ndarray:
    pos, n = 0, len(buf)
    if count * 4 > n:  # before allocating: each element takes at least its 4-byte length
        raise RequestError(
            400,
            f"input {name!r}: shape of {count} BYTES elements needs at least {count * 4} bytes, "
            f"binary_data_size is {n}",
        )
    out = np.empty(count, dtype=object)
    for i in range(count):
        if pos + 4 > n:
            raise RequestError(
                400, f"input {name!r}: BYTES data ends after {i} of {count} elements"
            )
        size = int.from_bytes(buf[pos : pos + 4], "little")
        pos += 4
        if pos + size > n:
            raise RequestError(400, f"input {name!r}: BYTES element {i} is cut short")
        out[i] = bytes(buf[pos : pos + size])
        pos += size
    if pos != n:
        raise RequestError(
            400, f"input {name!r}: {n - pos} bytes follow the last of {count} BYTES elements"
        )
    return out


def _from_json(data, dtype: np.dtype, shape, name: str, datatype: str) -> np.ndarray:
    count = _count(shape)
    if not isinstance(data, list):
        data = [data]  # a scalar: one element
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            if flat.size != count:  # before encoding every element
                return _wrong_count(name, shape, count, flat.size)
            arr = np.array(
                [v.encode() if isinstance(v, str) else _not_text(v) for v in flat], dtype=object
            )
        elif datatype == "BOOL":
            arr = np.asarray(data)
            if arr.size and arr.dtype != np.bool_:
                raise ValueError("BOOL data must be true or false")
            arr = arr.astype(np.bool_)
        elif dtype.kind == "f":
            arr = _floats(data, dtype, name, datatype)
        else:
            arr = np.asarray(data, dtype=dtype.newbyteorder("="))
    except (ValueError, TypeError, OverflowError) as exc:
        raise RequestError(400, f"input {name!r}: its data is not {datatype} ({exc})") from None
    if arr.size != count:
        _wrong_count(name, shape, count, arr.size)
    return arr.reshape(shape)


def _wrong_count(name: str, shape, count: int, size: int):
    raise RequestError(
        400, f"input {name!r}: shape {list(shape)} has {count} elements, 'data' has {size}"
    )


def _floats(data: list, dtype: np.dtype, name: str, datatype: str) -> np.ndarray:
    """Float data read as float64 first, so that a value past the datatype's range is refused
    instead of becoming infinity; "NaN"/"Infinity"/"-Infinity" strings are the non-finite ones."""
    try:
        wide = np.asarray(data, dtype=np.float64)
    except ValueError:  # strings other than the three names, or ragged lists
        wide = np.asarray(_named_floats(data), dtype=np.float64)
    if dtype == np.float64:
        return wide
    limit = float(np.finfo(dtype).max)
    finite = np.isfinite(wide)
    outside = finite & (np.abs(wide) > limit)
    if outside.any():
        value = wide[outside].flat[0]
        raise RequestError(
            400,
            f"input {name!r}: {value:g} is outside the range of {datatype} (±{limit:g}); "
            "send FP64, or scale the value",
        )
    return wide.astype(dtype.newbyteorder("="))


def _named_floats(data):
    if isinstance(data, list):
        return [_named_floats(v) for v in data]
    if isinstance(data, str):
        if data not in _NON_FINITE:
            raise ValueError(
                f"{data[:20]!r} is not a number (the names are NaN, Infinity, -Infinity)"
            )
        return _NON_FINITE[data]
    return data


def _not_text(value):
    raise ValueError(f"BYTES elements in JSON must be strings, not {type(value).__name__}")


def encode_response(
    outputs: dict[str, np.ndarray],
    *,
    model_name: str,
    model_version: str = "1",
    request: InferRequest,
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers for ``outputs`` (already restricted to what was asked).

    When every output is binary, the JSON header depends only on names, datatypes, shapes and
    sizes: it is written once per such combination and kept (the last 256)."""
    binary_of = {o.name: o.binary for o in request.outputs or []}
    binary = [
        request.binary_output if binary_of.get(name) is None else binary_of[name]
        for name in outputs
    ]
    if binary and all(binary):
        chunks = [_to_binary(arr) for arr in outputs.values()]
        key = tuple(
            (name, datatype_name(arr.dtype), arr.shape, len(raw))
            for (name, arr), raw in zip(outputs.items(), chunks)
        )
        header = _binary_header(model_name, model_version, request.id, key)
        return b"".join([header, *chunks]), {
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(header)),
        }
    tensors, chunks = [], []
    for (name, arr), as_binary in zip(outputs.items(), binary):
        entry = {"name": name, "datatype": datatype_name(arr.dtype), "shape": list(arr.shape)}
        if as_binary:
            raw = _to_binary(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json(arr)
        tensors.append(entry)
    header = _header_json(model_name, model_version, request.id, tensors)
    if not chunks:
        return header, {"content-type": "application/json"}
    return b"".join([header, *chunks]), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


@functools.lru_cache(maxsize=256)
def _binary_header(model_name: str, model_version: str, request_id: str | None, key) -> bytes:
    tensors = [
        {
            "name": name,
            "datatype": datatype,
            "shape": list(shape),
            "parameters": {"binary_data_size": size},
        }
        for name, datatype, shape, size in key
    ]
    return _header_json(model_name, model_version, request_id, tensors)


def _header_json(model_name: str, model_version: str, request_id: str | None, tensors) -> bytes:
    doc = {"model_name": model_name, "model_version": model_version, "outputs": tensors}
    if request_id is not None:
        doc["id"] = request_id
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _to_binary(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "OSU":
        parts = []
        for v in arr.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts += [len(b).to_bytes(4, "little"), b]
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _to_json(arr: np.ndarray) -> list:
    if arr.dtype.kind in "OSU":
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in arr.reshape(-1)
        ]
    if _BF16 is not None and arr.dtype == _BF16:
        arr = arr.astype(np.float32)
    flat = arr.reshape(-1)
    if flat.dtype.kind in "fc" and not np.isfinite(flat).all():
        return [v if math.isfinite(v) else _non_finite_name(v) for v in flat.tolist()]
    return flat.tolist()


def _non_finite_name(v: float) -> str:
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


__all__ = [
    "DATATYPES",
    "InferRequest",
    "RequestedOutput",
    "datatype_name",
    "decode_request",
    "decompress",
    "encode_response",
    "error_body",
]
