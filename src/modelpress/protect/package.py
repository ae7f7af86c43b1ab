"""The encrypted container (``.mpk``): a versioned, authenticated header, then the payload in
chunks, each sealed with AES-256-GCM (the ``cryptography`` package; nothing home-made).

Layout (big-endian)::

    header  magic(8) version(u16) algorithm(u16) kind(u16) flags(u16)
            key_id(16) salt(16) chunk_size(u32) chunk_count(u64) plain_size(u64)      68 bytes
    chunk i ciphertext (chunk_size bytes; the last one shorter) + GCM tag (16 bytes)

Rules the reader enforces:
- every chunk is sealed under a per-file key (HKDF-SHA256 of the user's key with the random
  ``salt``) and its own nonce (the chunk index), so no nonce repeats under one key;
- each chunk's authenticated data is the whole header plus its index and the chunk count, so a
  changed header, a chunk moved, dropped, duplicated or taken from another file fails its tag;
- the file's length must be exactly what the header announces, so a truncated file or one with
  bytes appended is refused before anything is decrypted;
- the key id (``keys.key_id``) is checked first, but a mismatch reads the same as a failed tag:
  under GCM a wrong key and a modified file cannot be told apart.

Decryption is a stream: ``decrypt_stream`` yields each chunk's plaintext after its tag checked,
from buffers it reuses, so memory stays at a few chunks whatever the payload's size; the caller
copies what it keeps. Nothing is ever written to disk on the way.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from modelpress.errors import MissingExtraError, ModelLoadError
from modelpress.protect.keys import check_key, key_id

MAGIC = b"\x89MPK\r\n\x1a\n"  # like PNG's: not text, and a line-ending translation breaks it
VERSION = 1
AES_256_GCM = 1
TAG_BYTES = 16
HEADER = struct.Struct(">8sHHHH16s16sIQQ")
DEFAULT_CHUNK = 1 << 20
MAX_CHUNK = 1 << 30

KIND_MODEL = 1  # the payload of a .mpk: a model (payload.py)
KIND_LIBRARY = 2  # an obfuscated model's operator library (library.py)
KIND_NAMES = {KIND_MODEL: "a model", KIND_LIBRARY: "an operator library"}

WRONG_KEY = "wrong key or the file was modified"


class PackageError(ModelLoadError):
    """A package that cannot be opened: not a package, truncated, wrong key or modified."""


def _aesgcm():
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise MissingExtraError(
            "cryptography", "protect", "encrypting or opening a protected model"
        ) from exc
    return AESGCM


def _file_key(key: bytes, salt: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=salt, info=b"modelpress mpk v1 chunks"
    ).derive(key)


def _nonce(index: int) -> bytes:
    return b"\0\0\0\0" + index.to_bytes(8, "big")


def _aad(header: bytes, index: int, count: int) -> bytes:
    return header + index.to_bytes(8, "big") + count.to_bytes(8, "big")


@dataclass(frozen=True)
class Header:
    version: int
    algorithm: int
    kind: int
    key_id: bytes
    salt: bytes
    chunk_size: int
    chunk_count: int
    plain_size: int
    raw: bytes

    @property
    def file_size(self) -> int:
        return HEADER.size + self.plain_size + TAG_BYTES * self.chunk_count


def chunk_count(plain_size: int, chunk_size: int) -> int:
    """Chunks for ``plain_size`` bytes; an empty payload still has one (its tag seals the header)."""
    return max(1, -(-plain_size // chunk_size))


def sealed_size(plain_size: int, chunk_size: int = DEFAULT_CHUNK) -> int:
    return HEADER.size + plain_size + TAG_BYTES * chunk_count(plain_size, chunk_size)


def encrypt_stream(
    segments: Iterable[bytes | bytearray | memoryview],
    plain_size: int,
    key: bytes,
    write: Callable[[memoryview], object],
    *,
    kind: int = KIND_MODEL,
    chunk_size: int = DEFAULT_CHUNK,
) -> Header:
    """Seal ``plain_size`` bytes, given as ``segments`` of any sizes, and pass the header and every
    sealed chunk to ``write`` in order. Memory: two chunk buffers."""
    key = check_key(key)
    if not 1 <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be between 1 and {MAX_CHUNK}")
    count = chunk_count(plain_size, chunk_size)
    salt = os.urandom(16)
    raw = HEADER.pack(
        MAGIC, VERSION, AES_256_GCM, kind, 0, key_id(key), salt, chunk_size, count, plain_size
    )
    header = Header(
        VERSION, AES_256_GCM, kind, key_id(key), salt, chunk_size, count, plain_size, raw
    )
    aead = _aesgcm()(_file_key(key, salt))
    write(memoryview(raw))
    plain = bytearray(chunk_size)
    sealed = bytearray(chunk_size + TAG_BYTES)
    filled = 0
    index = 0
    total = 0

    def seal(n: int) -> None:
        nonlocal index
        aead.encrypt_into(
            _nonce(index),
            memoryview(plain)[:n],
            _aad(raw, index, count),
            memoryview(sealed)[: n + TAG_BYTES],
        )
        write(memoryview(sealed)[: n + TAG_BYTES])
        index += 1

    for segment in segments:
        view = memoryview(segment).cast("B")
        total += len(view)
        if total > plain_size:
            raise ValueError(f"the payload is longer than the {plain_size} bytes announced")
        pos = 0
        while pos < len(view):
            take = min(chunk_size - filled, len(view) - pos)
            plain[filled : filled + take] = view[pos : pos + take]
            filled += take
            pos += take
            if filled == chunk_size:
                seal(filled)
                filled = 0
    if total != plain_size:
        raise ValueError(f"the payload has {total} bytes, {plain_size} were announced")
    if filled or index < count:
        seal(filled)
    assert index == count, (index, count)
    return header


def encrypt_bytes(data: bytes, key: bytes, *, kind: int, chunk_size: int = DEFAULT_CHUNK) -> bytes:
    out = io.BytesIO()
    encrypt_stream([data], len(data), key, out.write, kind=kind, chunk_size=chunk_size)
    return out.getvalue()


class _Source:
    """A package to read: a path (opened here) or bytes in memory, with its total size."""

    def __init__(
        self, source: str | os.PathLike | bytes | bytearray | memoryview, name: str | None
    ):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.name = name or "package"
            self.file: BinaryIO = io.BytesIO(source)
            self.size = len(source)
        else:
            p = Path(source)
            self.name = name or str(p)
            if not p.is_file():
                raise PackageError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
            try:
                self.file = open(p, "rb")  # noqa: SIM115 - closed by close()
                self.size = os.fstat(self.file.fileno()).st_size
            except OSError as exc:
                raise PackageError(f"{p}: cannot be read: {exc.strerror or exc}") from None

    def close(self) -> None:
        self.file.close()


def _parse_header(raw: bytes, size: int, name: str, expect_kind: int | None) -> Header:
    if len(raw) < len(MAGIC) or raw[: len(MAGIC)] != MAGIC:
        raise PackageError(
            f"{name}: not a modelpress package (it does not start with the .mpk signature)"
        )
    if len(raw) < HEADER.size:
        raise PackageError(f"{name}: truncated: {size} bytes, shorter than a package header")
    _, version, algorithm, kind, _flags, kid, salt, csize, count, plain = HEADER.unpack(
        raw[: HEADER.size]
    )
    if version != VERSION:
        raise PackageError(
            f"{name}: package format version {version} is not supported (this modelpress reads version {VERSION}); "
            "upgrade modelpress, or the file was modified"
        )
    if algorithm != AES_256_GCM:
        raise PackageError(
            f"{name}: unknown encryption algorithm {algorithm}; upgrade modelpress, or the file was modified"
        )
    header = Header(version, algorithm, kind, kid, salt, csize, count, plain, raw[: HEADER.size])
    if not 1 <= csize <= MAX_CHUNK or count != chunk_count(plain, csize):
        raise PackageError(f"{name}: {WRONG_KEY} (its header is inconsistent)")
    if expect_kind is not None and kind != expect_kind:
        what = KIND_NAMES.get(kind, f"content of kind {kind}")
        raise PackageError(f"{name}: holds {what}, not {KIND_NAMES[expect_kind]} ({WRONG_KEY}?)")
    if size < header.file_size:
        raise PackageError(f"{name}: truncated: {size} of {header.file_size} bytes")
    if size > header.file_size:
        raise PackageError(
            f"{name}: {size - header.file_size} bytes after the last chunk ({WRONG_KEY})"
        )
    return header


def read_header(source, *, name: str | None = None, expect_kind: int | None = KIND_MODEL) -> Header:
    """The checked header of a package (path or bytes); PackageError when it is not one."""
    src = _Source(source, name)
    try:
        return _parse_header(src.file.read(HEADER.size), src.size, src.name, expect_kind)
    finally:
        src.close()


def decrypt_stream(
    source: str | os.PathLike | bytes | bytearray | memoryview,
    key: bytes,
    *,
    expect_kind: int = KIND_MODEL,
    name: str | None = None,
) -> Iterator[memoryview]:
    """The plaintext of a package, chunk by chunk, each authenticated before it is yielded.

    A yielded view is valid until the next one is requested (its buffer is reused). PackageError
    on the first problem; a consumer that stops early has read only authentic bytes.
    """
    key = check_key(key)
    src = _Source(source, name)
    try:
        header = _parse_header(src.file.read(HEADER.size), src.size, src.name, expect_kind)
        if header.key_id != key_id(key):
            raise PackageError(
                f"{src.name}: {WRONG_KEY} (the key's id does not match the package's)"
            )
        aead = _aesgcm()(_file_key(key, header.salt))
        from cryptography.exceptions import InvalidTag

        sealed = bytearray(header.chunk_size + TAG_BYTES)
        plain = bytearray(header.chunk_size)
        left = header.plain_size
        for index in range(header.chunk_count):
            n = min(header.chunk_size, left)
            view = memoryview(sealed)[: n + TAG_BYTES]
            if src.file.readinto(view) != n + TAG_BYTES:
                raise PackageError(
                    f"{src.name}: truncated in chunk {index + 1} of {header.chunk_count}"
                )
            out = memoryview(plain)[:n]
            try:
                aead.decrypt_into(
                    _nonce(index), view, _aad(header.raw, index, header.chunk_count), out
                )
            except InvalidTag:
                raise PackageError(
                    f"{src.name}: {WRONG_KEY} (chunk {index + 1} of {header.chunk_count} failed authentication)"
                ) from None
            left -= n
            yield out
    finally:
        src.close()


def decrypt_bytes(blob, key: bytes, *, expect_kind: int, name: str | None = None) -> bytes:
    """The whole plaintext of a (small) package in memory."""
    return b"".join(
        bytes(part) for part in decrypt_stream(blob, key, expect_kind=expect_kind, name=name)
    )


def has_magic(source: str | os.PathLike | bytes | bytearray | memoryview) -> bool:
    """Whether ``source`` starts with the package signature (says nothing of its integrity)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[: len(MAGIC)]) == MAGIC
    try:
        with open(source, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False
