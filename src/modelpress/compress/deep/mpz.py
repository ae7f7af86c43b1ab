"""The ``.mpz`` file: a Deep Compression model, decoded to a standard ONNX model in memory.

Layout (integers little-endian)::

    b"MPZ1"  u32 n  header (n bytes, JSON: {"version": 2, "sections": [[name, length], ...]})  sections

Each section is one zstd frame, in the order and of the length the header lists; streams of one
kind from every tensor are concatenated into one section, so that each kind pays for one entropy
table, not one per tensor (in a small model those tables and frame headers are a large share):

- ``model``: u32 m, the tensor table (m bytes of JSON, one entry per tensor stored outside the
  graph, in the order of the sections' streams), then the ONNX model with those tensors' data left
  out (each initializer kept, empty). Every entry has ``name``, ``shape``, ``dtype`` (the
  rebuilt tensor's) and ``form``: ``"float16"`` (its values in ``side``) or ``"shared"``, which
  adds ``bits``, ``book`` (codebook entries), ``book_dtype``, ``index`` (``"gaps"`` or
  ``"masks"``), ``index_bytes`` (its length there) and ``kept`` (weights kept, one code each);
- ``side``: the float tensors that are not shared but hold float16 values exactly (biases,
  normalizations folded into them, layers kept dense), as float16;
- ``codebooks``: each shared tensor's codebook, only the entries its weights use, as float16 where
  that is exact (``"book_dtype"``), else float32;
- ``gaps`` or ``masks``: where each shared tensor's kept weights are, whichever its entry's
  ``"index"`` names (``index.py``: relative positions or a bitmask, the smaller);
- ``codes``: each kept weight's codebook index, one byte each.

zstd's entropy stage (Huffman and FSE over the bytes) stores each stream in close to its order-0
entropy: the Huffman coding of Han et al., by a well-kept library. ``decode`` rebuilds every tensor
exactly. A file that is not an ``.mpz``, is of another version, is truncated, or does not decode
gives one ``ModelLoadError``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.compress.deep import index
from modelpress.errors import ModelLoadError, require
from modelpress.ir import model_bytes
from modelpress.ir.graph import copy_model
from modelpress.ir.io import from_bytes

MAGIC = b"MPZ1"
VERSION = 2
LEVEL = 19
SECTIONS = ("model", "side", "codebooks", "gaps", "masks", "codes")


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


def is_half_exact(array: np.ndarray) -> bool:
    """Whether float16 holds every value of ``array`` exactly (then it is stored as float16)."""
    if array.dtype.kind != "f":
        return False
    with np.errstate(over="ignore"):
        return bool(np.array_equal(array.astype(np.float16).astype(array.dtype), array))


def _shared_entry(t: SharedTensor, streams: dict[str, list[bytes]], cost) -> dict:
    kept_codes = t.codes[t.mask].astype(np.int64)
    used, compact = np.unique(kept_codes, return_inverse=True)  # only the entries in use are stored
    assert used.size <= 2**t.bits <= 256, t.name
    book = t.codebook[used].astype(np.float32) if used.size else np.zeros(0, np.float32)
    book_dtype = "float16" if is_half_exact(book) else "float32"
    streams["codebooks"].append(book.astype("<f2" if book_dtype == "float16" else "<f4").tobytes())
    kind, positions = index.encode(t.mask, cost)
    streams[kind].append(positions)
    streams["codes"].append(compact.astype(np.uint8).tobytes())
    return {
        "name": t.name,
        "shape": list(t.mask.shape),
        "dtype": t.dtype,
        "form": "shared",
        "bits": t.bits,
        "book": int(used.size),
        "book_dtype": book_dtype,
        "index": kind,
        "index_bytes": len(positions),
        "kept": int(t.mask.sum()),
    }


def encode(model: ir.Model, tensors: list[SharedTensor]) -> tuple[bytes, dict]:
    """The ``.mpz`` bytes of ``model`` with ``tensors`` shared, and the byte count of each part.

    Every other float initializer of more than one value that float16 holds exactly goes to the
    ``side`` section; the rest stays in the model as it is. Nothing is rounded here: the caller
    decides what is float16 (``api`` rounds before the last retraining).
    """
    zstd = _zstd()
    cctx = zstd.ZstdCompressor(level=LEVEL)
    base = copy_model(model)
    streams: dict[str, list[bytes]] = {name: [] for name in SECTIONS}
    table: list[dict] = []
    shared = {t.name for t in tensors}
    for t in tensors:
        table.append(_shared_entry(t, streams, lambda b: len(cctx.compress(b))))
    for name, value in model.graph.initializers.items():
        array = value.const_value.numpy() if value.const_value is not None else None
        if name in shared or array is None or array.size <= 1 or not is_half_exact(array):
            continue
        streams["side"].append(array.astype("<f2").tobytes())
        table.append(
            {"name": name, "shape": list(array.shape), "dtype": array.dtype.name, "form": "float16"}
        )
    for entry in table:
        value = base.graph.initializers[entry["name"]]
        # the data is in the sections (the table gives the dtype and shape); the initializer stays, empty
        value.const_value = ir.tensor(np.zeros((0,), np.float32), name=entry["name"])
        value.shape = ir.Shape((0,))
    head = json.dumps(table, separators=(",", ":")).encode()
    streams["model"] = [struct.pack("<I", len(head)), head, model_bytes(base)]
    frames = {name: cctx.compress(b"".join(parts)) for name, parts in streams.items() if parts}
    header = json.dumps(
        {"version": VERSION, "sections": [[n, len(f)] for n, f in frames.items()]},
        separators=(",", ":"),
    ).encode()
    data = MAGIC + struct.pack("<I", len(header)) + header + b"".join(frames.values())
    sizes = {"header": len(header) + 8} | {name: len(frames.get(name, b"")) for name in SECTIONS}
    return data, sizes


def _sections(data: bytes, source: str) -> dict[str, bytes]:
    """The decompressed sections of an ``.mpz`` (the header checked)."""
    if data[:4] != MAGIC:
        raise ModelLoadError(f"{source}: not a modelpress .mpz file (bad magic)")
    (n,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict) or header.get("version") != VERSION:
        version = header.get("version") if isinstance(header, dict) else None
        raise ModelLoadError(
            f"{source}: .mpz version {version} is not supported (this modelpress reads {VERSION})"
        )
    dctx = _zstd().ZstdDecompressor()
    out: dict[str, bytes] = {}
    offset = 8 + n
    for name, length in header["sections"]:
        if name not in SECTIONS or name in out:
            raise ValueError(f"unknown or repeated section {name!r}")
        length = int(length)
        if length < 0 or offset + length > len(data):
            raise ValueError(f"section {name!r} runs past the end of the file")
        out[name] = dctx.decompress(data[offset : offset + length])
        offset += length
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes after the last section")
    return out


class _Reader:
    """Consumes one section's bytes in order; reading past its end or leaving bytes is an error."""

    def __init__(self, name: str, data: bytes):
        self.name, self.data, self.at = name, data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"section {self.name!r} is shorter than its tensors need")
        self.at += n
        return self.data[self.at - n : self.at]

    def done(self) -> None:
        if self.at != len(self.data):
            raise ValueError(
                f"section {self.name!r} holds {len(self.data) - self.at} bytes no tensor reads"
            )


def _shared_array(entry: dict, size: int, readers: dict[str, _Reader]) -> np.ndarray:
    bits, n_book, kept = int(entry["bits"]), int(entry["book"]), int(entry["kept"])
    widths = {"float16": 2, "float32": 4}
    if entry["book_dtype"] not in widths:
        raise ValueError(
            f"tensor {entry['name']!r}: unknown codebook dtype {entry['book_dtype']!r}"
        )
    width = widths[entry["book_dtype"]]
    if not 1 <= bits <= 8 or not 0 <= n_book <= 2**bits or not 0 <= kept <= size:
        raise ValueError(
            f"tensor {entry['name']!r}: bits, codebook size or kept count out of range"
        )
    book = np.frombuffer(
        readers["codebooks"].take(n_book * width), "<f2" if width == 2 else "<f4"
    ).astype(np.float32)
    kind = entry["index"]
    if kind not in index.KINDS:
        raise ValueError(f"tensor {entry['name']!r}: unknown index kind {kind!r}")
    positions = index.decode(
        kind, readers[kind].take(int(entry["index_bytes"])), size=size, kept=kept
    )
    codes = np.frombuffer(readers["codes"].take(kept), np.uint8)
    if kept and codes.max() >= n_book:
        raise ValueError(f"tensor {entry['name']!r}: a code is out of its codebook")
    flat = np.zeros(size, np.float32)
    flat[positions] = book[codes]
    return flat


def decode(data: bytes, *, source: str = "the .mpz data") -> ir.Model:
    """The standard ONNX model an ``.mpz`` holds (every tensor rebuilt)."""
    try:
        sections = _sections(data, source)
        readers = {name: _Reader(name, sections.get(name, b"")) for name in SECTIONS}
        (m,) = struct.unpack("<I", readers["model"].take(4))
        table = json.loads(readers["model"].take(m))
        model = from_bytes(readers["model"].take(len(sections["model"]) - 4 - m), source=source)
        for entry in table:
            shape = tuple(int(d) for d in entry["shape"])
            if any(d < 0 for d in shape):
                raise ValueError(f"tensor {entry['name']!r}: a negative dimension")
            size = int(np.prod(shape, dtype=np.int64))
            if entry["form"] == "shared":
                flat = _shared_array(entry, size, readers)
            elif entry["form"] == "float16":
                flat = np.frombuffer(readers["side"].take(2 * size), "<f2")
            else:
                raise ValueError(f"tensor {entry['name']!r}: unknown form {entry['form']!r}")
            value = model.graph.initializers.get(entry["name"])
            if value is None:
                raise ValueError(f"tensor {entry['name']!r} is not an initializer of the model")
            value.const_value = ir.tensor(
                flat.reshape(shape).astype(np.dtype(entry["dtype"])), name=entry["name"]
            )
            value.shape = ir.Shape(shape)
        for reader in readers.values():
            reader.done()
        return model
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated or damaged data, whatever the decoder says
        if isinstance(exc, KeyError):
            msg = f"a field {exc.args[0]!r} is missing"
        else:
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
