"""What a package holds: a model as one byte stream, written and read without ever holding the
stream whole.

Layout::

    b"MPKMODEL" proto_size(u64, big-endian) ModelProto tensor-bytes...

Every tensor of at least ``INLINE_BYTES`` (initializers of every graph) is left out of the
ModelProto, which keeps an external-data reference (location ``mpk:payload``, offset, length)
into the tensor bytes that follow; so a model of any size (ONNX's 2 GB protobuf limit included)
becomes a small ModelProto and a run of raw tensors. Writing streams each tensor from where it
lives (memory, or the external-data file of a model on disk) in pieces; reading fills each
tensor's own buffer straight from the decrypted chunks. Memory stays at the model's tensors plus
a few chunks; nothing is written to disk.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelLoadError
from modelpress.ir import from_bytes, model_bytes
from modelpress.ir.files import existing_file
from modelpress.ir.stats import all_graphs

PAYLOAD_MAGIC = b"MPKMODEL"
LOCATION = "mpk:payload"
INLINE_BYTES = 1024
_READ_PIECE = 4 << 20


def _initializers(model: ir.Model) -> Iterator[ir.Value]:
    for graph in model.graphs():
        yield from graph.initializers.values()


def _external(value: ir.Value) -> bool:
    t = value.const_value
    return t is not None and t.dtype.bitwidth >= 8 and t.nbytes >= INLINE_BYTES


@contextmanager
def _references(model: ir.Model, tensors: list[ir.TensorProtocol]):
    """Within the block, every large initializer of ``model`` is a reference into the tensor
    section (the real tensors, in order, in ``tensors``); the model is put back on exit."""
    swapped = []
    offset = 0
    try:
        for value in _initializers(model):
            if not _external(value):
                continue
            t = value.const_value
            ref = ir.ExternalTensor(
                LOCATION, offset, t.nbytes, t.dtype, shape=t.shape, name=value.name
            )
            swapped.append((value, t))
            tensors.append(t)
            value.const_value = ref
            offset += t.nbytes
        yield
    finally:
        for value, t in swapped:
            value.const_value = t


def _tensor_pieces(t: ir.TensorProtocol) -> Iterator[memoryview]:
    if isinstance(t, ir.ExternalTensor):
        # A model loaded lazily from disk: stream its external data instead of loading it.
        with open(t.path, "rb") as f:
            f.seek(t.offset or 0)
            left = t.nbytes
            while left:
                piece = f.read(min(_READ_PIECE, left))
                if not piece:
                    raise ModelLoadError(
                        f"{t.path}: external data ends before tensor {t.name!r} does"
                    )
                left -= len(piece)
                yield memoryview(piece)
        return
    if (
        isinstance(t, ir.Tensor)
        and t.dtype.bitwidth >= 8
        and t.dtype.numpy().itemsize == t.dtype.itemsize
    ):
        arr = np.ascontiguousarray(t.numpy())
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        yield memoryview(arr.reshape(-1).view(np.uint8))
        return
    yield memoryview(t.tobytes())


def model_stream(model: ir.Model) -> tuple[int, Iterable[memoryview]]:
    """``(size, segments)``: the payload of ``model`` as a byte count and the pieces that make it
    (read lazily, in order; consume them before changing the model)."""
    tensors: list[ir.TensorProtocol] = []
    with _references(model, tensors):
        proto = model_bytes(model)
    size = len(PAYLOAD_MAGIC) + 8 + len(proto) + sum(t.nbytes for t in tensors)

    def segments() -> Iterator[memoryview]:
        yield memoryview(PAYLOAD_MAGIC + len(proto).to_bytes(8, "big"))
        yield memoryview(proto)
        for t in tensors:
            yield from _tensor_pieces(t)

    return size, segments()


class _ChunkReader:
    """Reads exact byte counts out of a stream of chunk views (each valid until the next)."""

    def __init__(self, chunks: Iterator[memoryview], name: str):
        self.chunks = chunks
        self.name = name
        self.view = memoryview(b"")

    def readinto(self, out: memoryview) -> None:
        pos = 0
        while pos < len(out):
            if not len(self.view):
                try:
                    self.view = next(self.chunks)
                except StopIteration:
                    raise ModelLoadError(
                        f"{self.name}: the payload ends early (a damaged package)"
                    ) from None
                continue
            take = min(len(self.view), len(out) - pos)
            out[pos : pos + take] = self.view[:take]
            self.view = self.view[take:]
            pos += take

    def read(self, n: int) -> bytes:
        buf = bytearray(n)
        self.readinto(memoryview(buf))
        return bytes(buf)

    def finish(self) -> None:
        if len(self.view) or next(self.chunks, None) is not None:
            raise ModelLoadError(
                f"{self.name}: bytes after the model's last tensor (a damaged package)"
            )


def read_model(chunks: Iterator[memoryview], *, name: str = "package") -> ir.Model:
    """The model a payload holds, its tensors filled from ``chunks`` (views from
    ``package.decrypt_stream``) one after the other."""
    reader = _ChunkReader(iter(chunks), name)
    head = reader.read(len(PAYLOAD_MAGIC) + 8)
    if head[: len(PAYLOAD_MAGIC)] != PAYLOAD_MAGIC:
        raise ModelLoadError(f"{name}: the package does not hold a model payload")
    proto_size = int.from_bytes(head[len(PAYLOAD_MAGIC) :], "big")
    model = from_bytes(reader.read(proto_size), source=name)
    refs = [
        v
        for v in _initializers(model)
        if isinstance(v.const_value, ir.ExternalTensor) and v.const_value.location == LOCATION
    ]
    expected = 0
    for value in sorted(refs, key=lambda v: v.const_value.offset):
        ref = value.const_value
        if ref.offset != expected:
            raise ModelLoadError(
                f"{name}: tensor {value.name!r} is not where the payload says (a damaged package)"
            )
        buf = np.empty(ref.length, dtype=np.uint8)
        reader.readinto(memoryview(buf))
        array = buf.view(ref.dtype.numpy()).reshape(tuple(ref.shape.numpy()))
        value.const_value = ir.Tensor(array, dtype=ref.dtype, name=ref.name)
        expected += ref.length
    reader.finish()
    return model


def model_payload_bytes(model: ir.Model) -> bytes:
    """The whole payload in memory (small models, tests)."""
    size, segments = model_stream(model)
    out = b"".join(bytes(s) for s in segments)
    assert len(out) == size
    return out


def _owned(t: ir.TensorProtocol) -> ir.TensorProtocol:
    if isinstance(t, ir.serde.TensorProtoTensor) and t.dtype.bitwidth >= 8:
        try:
            return ir.Tensor(t.numpy(), dtype=t.dtype, name=t.name, doc_string=t.doc_string)
        except Exception:  # noqa: BLE001 - a type numpy cannot hold stays as it was
            return t
    return t


def load_original(path: str | os.PathLike) -> ir.Model:
    """``load_lazily``, the tensors stored inline copied out of the protobuf once (each read of
    a protobuf tensor copies it again, and any one of them keeps the whole message alive), and
    the message let go: an inline model then takes its size in memory once."""
    model = load_lazily(path)
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            if value.const_value is not None:
                value.const_value = _owned(value.const_value)
        for node in graph:
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR:
                    node.attributes[name] = ir.AttrTensor(name, _owned(attr.value))
                elif attr.type == ir.AttributeType.TENSORS:
                    node.attributes[name] = ir.AttrTensors(name, [_owned(t) for t in attr.value])
    gc.collect()
    return model


def load_lazily(path: str | os.PathLike) -> ir.Model:
    """An ONNX file whose external data stays on disk until streamed (for models over 2 GB)."""
    p = existing_file(path, what="an .onnx file", error=ModelLoadError)
    try:
        return ir.load(p)
    except Exception as exc:  # protobuf and onnx_ir raise many types for a file that is not ONNX
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"{p}: not a valid ONNX file ({text})") from None
