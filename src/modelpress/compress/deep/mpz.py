"""The ``.mpz`` file: a Deep Compression model, decoded to a standard ONNX model in memory.

Layout (all integers little-endian)::

    b"MPZ1"  u32 header length  header (JSON, UTF-8)  body

The body is a sequence of zstd frames, each at the offset and of the length the header gives:
``model`` is the ONNX model with the shared weights' data left out (their initializers kept with
their shape and type but no data), and each shared tensor has a ``codebook`` (float32 centroids),
``gaps`` and ``codes``. A tensor's kept weights are listed in row-major order: ``gaps`` holds
the distance from the previous kept position (one byte each; a distance over 255 is written as
255s that step over positions without a weight, each taking the filler code ``2**bits``), and
``codes`` the codebook index of each entry, one byte each. zstd's entropy stage (Huffman and FSE
over the bytes) then stores each stream in close to its order-0 entropy: the Huffman coding of
Han et al., by a well-kept library.

``decode`` rebuilds every tensor exactly: ``codebook[code]`` at each kept position, zero elsewhere.
A file that is not an ``.mpz``, is truncated, or does not decode gives one ``ModelLoadError``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelLoadError, require
from modelpress.ir import model_bytes
from modelpress.ir.graph import copy_model
from modelpress.ir.io import from_bytes

MAGIC = b"MPZ1"
VERSION = 1
MAX_GAP = 255
LEVEL = 19


def _zstd():
    return require("zstandard", extra="compress", purpose="Deep Compression (.mpz files)")


@dataclass
class SharedTensor:
    name: str
    codebook: np.ndarray  # float32, at most 2**bits entries
    codes: np.ndarray  # int, the tensor's shape (pruned positions: ignored)
    mask: np.ndarray  # bool, the tensor's shape
    bits: int
    dtype: str = "float32"

    def dense(self) -> np.ndarray:
        return np.where(self.mask, self.codebook[self.codes], np.float32(0)).astype(self.dtype)


def _streams(t: SharedTensor) -> tuple[bytes, bytes]:
    """The gap and code byte streams of one tensor (see the module docstring)."""
    positions = np.flatnonzero(t.mask.reshape(-1))
    codes = t.codes.reshape(-1)[positions]
    gaps = np.diff(np.concatenate([[-1], positions]))
    filler = 2**t.bits
    gap_out, code_out = [], []
    # a gap over 255 becomes 255-steps onto filler entries, then the remainder
    for gap, code in zip(gaps.tolist(), codes.tolist()):
        while gap > MAX_GAP:
            gap_out.append(MAX_GAP)
            code_out.append(filler)
            gap -= MAX_GAP
        gap_out.append(gap)
        code_out.append(code)
    dtype = np.uint8 if filler < 256 else np.uint16
    return np.asarray(gap_out, np.uint8).tobytes(), np.asarray(code_out, dtype).tobytes()


def encode(model: ir.Model, tensors: list[SharedTensor]) -> tuple[bytes, dict]:
    """The ``.mpz`` bytes of ``model`` with ``tensors`` shared, and the byte count of each part."""

    zstd = _zstd()
    cctx = zstd.ZstdCompressor(level=LEVEL)
    base = copy_model(model)
    for t in tensors:
        value = base.graph.initializers[t.name]
        # the weights are in the codes; the initializer keeps its name, type and shape
        value.const_value = ir.tensor(np.zeros((0,), np.float32), name=t.name)
        value.shape = ir.Shape((0,))
    frames: list[bytes] = []
    header: dict = {"format": "modelpress.mpz", "version": VERSION, "tensors": []}
    sizes = {"model": 0, "codebooks": 0, "gaps": 0, "codes": 0}

    def add(data: bytes, part: str) -> dict:
        frame = cctx.compress(data)
        entry = {"offset": sum(len(f) for f in frames), "length": len(frame)}
        frames.append(frame)
        sizes[part] += len(frame)
        return entry

    header["model"] = add(model_bytes(base), "model")
    for t in tensors:
        gaps, codes = _streams(t)
        header["tensors"].append({
            "name": t.name,
            "shape": list(t.mask.shape),
            "dtype": t.dtype,
            "bits": t.bits,
            "codebook": add(t.codebook.astype("<f4").tobytes(), "codebooks"),
            "gaps": add(gaps, "gaps"),
            "codes": add(codes, "codes"),
        })
    head = json.dumps(header, separators=(",", ":")).encode()
    data = MAGIC + struct.pack("<I", len(head)) + head + b"".join(frames)
    sizes["header"] = len(head) + 8
    return data, sizes


def decode(data: bytes, *, source: str = "the .mpz data") -> ir.Model:
    """The standard ONNX model an ``.mpz`` holds (every shared weight rebuilt)."""

    zstd = _zstd()
    if data[:4] != MAGIC:
        raise ModelLoadError(f"{source}: not a modelpress .mpz file (bad magic)")
    try:
        (n,) = struct.unpack("<I", data[4:8])
        header = json.loads(data[8 : 8 + n])
        body = memoryview(data)[8 + n :]
        dctx = zstd.ZstdDecompressor()

        def frame(entry: dict) -> bytes:
            start, length = int(entry["offset"]), int(entry["length"])
            if start < 0 or start + length > len(body):
                raise ValueError("a section runs past the end of the file")
            return dctx.decompress(bytes(body[start : start + length]))

        if header.get("version") != VERSION:
            raise ModelLoadError(f"{source}: .mpz version {header.get('version')} is not supported (this modelpress reads {VERSION})")
        model = from_bytes(frame(header["model"]), source=source)
        for entry in header["tensors"]:
            shape = tuple(int(d) for d in entry["shape"])
            bits = int(entry["bits"])
            codebook = np.frombuffer(frame(entry["codebook"]), "<f4")
            gaps = np.frombuffer(frame(entry["gaps"]), np.uint8).astype(np.int64)
            codes = np.frombuffer(frame(entry["codes"]), np.uint8 if 2**bits < 256 else np.uint16).astype(np.int64)
            if gaps.size != codes.size:
                raise ValueError(f"tensor {entry['name']!r}: gap and code streams differ in length")
            positions = np.cumsum(gaps) - 1
            real = codes != 2**bits
            flat = np.zeros(int(np.prod(shape)), np.float32)
            if real.any():
                if positions[real].max() >= flat.size or codes[real].max() >= codebook.size:
                    raise ValueError(f"tensor {entry['name']!r}: an index is out of range")
                flat[positions[real]] = codebook[codes[real]]
            value = model.graph.initializers.get(entry["name"])
            if value is None:
                raise ValueError(f"tensor {entry['name']!r} is not an initializer of the model")
            value.const_value = ir.tensor(flat.reshape(shape).astype(entry.get("dtype", "float32")), name=entry["name"])
            value.shape = ir.Shape(shape)
        return model
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated or damaged data, whatever the decoder says
        msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{source}: the .mpz file is damaged or truncated ({msg})") from None


def open_mpz(path: str | os.PathLike) -> ir.Model:
    """The ONNX model stored in the ``.mpz`` file at ``path``, decoded in memory."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ModelLoadError(f"{p}: no such file") from None
    except OSError as exc:
        raise ModelLoadError(f"{p}: cannot be read ({exc.strerror})") from None
    return decode(data, source=str(p))
