"""The journal that makes a batch run resumable: an append-only file of checksummed records,
each written and fsync'd before the run goes on, beside the output (``OUT.mp-journal``).

Why it holds, whenever the process dies (SIGKILL included):

- a record reaches the file with one ``write`` and is ``fsync``'d before the next batch is taken;
  a kill in the middle leaves a short or torn last record, which fails its length or CRC check
  when the journal is opened again and is cut off: the items it held are simply run again;
- the items of a whole record are done; those of a cut-off one are not: no item is lost, and
  since a run skips every item the journal holds, none is written twice;
- the output file is written only at the end, from the journal, under a temporary name renamed
  into place (``ir.files.atomic``), then the journal is removed. A kill before the rename leaves
  the old output (or none) and the whole journal; a kill after it and before the removal leaves
  a complete journal that writes the same file again.

The first record is a header holding the run's fingerprint (model, data, processing, output
format): a journal left by another command is refused instead of mixed in. An exclusive lock
(``flock``) keeps two runs from writing one journal at once.

Record layout: ``b"MPJ1"`` | kind (1 byte: ``H`` header, ``R`` results) | meta length (u32) |
data length (u64) | CRC-32 of kind+meta+data (u32) | meta (JSON) | data.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from modelpress.errors import InputError, ModelSaveError

MAGIC = b"MPJ1"
_HEAD = struct.Struct("<4scIQI")
SUFFIX = ".mp-journal"


@dataclass(frozen=True)
class Record:
    items: list[int]  # the item indices the record holds, in the order of its data
    data: bytes
    errors: int = 0  # of those, the items that could not be read (an error line each)


def journal_path(output: str | os.PathLike) -> Path:
    p = Path(output)
    return p.with_name(p.name + SUFFIX)


def encode(kind: bytes, meta: dict, data: bytes = b"") -> bytes:
    m = json.dumps(meta, separators=(",", ":")).encode()
    crc = zlib.crc32(kind + m + data)
    return _HEAD.pack(MAGIC, kind, len(m), len(data), crc) + m + data


def scan(blob: bytes) -> tuple[list[tuple[bytes, dict, bytes]], int]:
    """The whole records at the start of ``blob`` and the offset where they end."""
    out = []
    pos = 0
    while pos + _HEAD.size <= len(blob):
        magic, kind, mlen, dlen, crc = _HEAD.unpack_from(blob, pos)
        end = pos + _HEAD.size + mlen + dlen
        if magic != MAGIC or end > len(blob):
            break
        m = blob[pos + _HEAD.size : pos + _HEAD.size + mlen]
        data = blob[pos + _HEAD.size + mlen : end]
        if zlib.crc32(kind + m + data) != crc:
            break
        try:
            meta = json.loads(m)
        except ValueError:
            break
        out.append((kind, meta, data))
        pos = end
    return out, pos


class Journal:
    """Open (or create) the journal for ``output``; ``done`` holds the items already written."""

    def __init__(self, output: str | os.PathLike, fingerprint: str, *, restart: bool = False):
        self.path = journal_path(output)
        self.fingerprint = fingerprint
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ModelSaveError(
                f"{self.path}: cannot write the run's journal ({exc.strerror})"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise InputError(
                f"{self.path}: another run is writing {Path(output).name} now"
            ) from None
        self.records: list[Record] = []
        try:
            self._open(restart)
        except BaseException:
            self.close()
            raise
        self.done: set[int] = {i for r in self.records for i in r.items}

    def _open(self, restart: bool) -> None:
        size = os.fstat(self._fd).st_size
        blob = os.pread(self._fd, size, 0) if size else b""
        records, end = scan(blob)
        header = records[0] if records and records[0][0] == b"H" else None
        if (
            size
            and header is not None
            and header[1].get("fingerprint") != self.fingerprint
            and not restart
        ):
            raise InputError(
                f"{self.path}: left by a run with another model, data or output format; "
                "remove it, or pass `restart` to start over"
            )
        if header is None or restart or header[1].get("fingerprint") != self.fingerprint:
            os.ftruncate(self._fd, 0)
            self._append(encode(b"H", {"fingerprint": self.fingerprint}))
            return
        if end < size:  # a torn last record: its items run again
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        self.records = [
            Record(meta["items"], data, meta.get("errors", 0))
            for kind, meta, data in records[1:]
            if kind == b"R"
        ]

    def _append(self, blob: bytes) -> None:
        os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(blob)
        while view:  # one write almost always; a short write is continued, never interleaved
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def append(self, items: list[int], data: bytes, *, errors: int = 0) -> None:
        """Record ``items`` as done with their results ``data``, durably, before returning."""
        dup = self.done.intersection(items)
        assert not dup, f"items written twice: {sorted(dup)[:5]}"
        self._append(encode(b"R", {"items": list(items), "errors": errors}, data))
        self.records.append(Record(list(items), data, errors))
        self.done.update(items)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def remove(self) -> None:
        """Delete the journal (after the output it fed was written)."""
        self.path.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # also releases the lock
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
