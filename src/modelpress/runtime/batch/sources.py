"""What a batch run reads: a folder of files (images, audio), a ``.jsonl`` of texts, or an
``.npz`` of arrays named after the model's inputs.

Items have a stable order (a folder's files sorted by their path inside it; a file's lines in
order) and an id the output names them by (the relative path, the line's ``id`` or its number,
the row). The fingerprint changes when the items do, so a resumed run refuses changed data.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelpress.errors import InputError
from modelpress.ir.feeds import load_npz
from modelpress.runtime.samples import SUFFIXES, read_jsonl


@dataclass
class Items:
    """Raw items (file paths or texts) for a model that declares pre-processing."""

    ids: list[str]
    payloads: list  # Path (read by the worker) or str (a text)
    fingerprint: str

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Arrays:
    """Arrays by input name; rows along axis 0 are the samples."""

    arrays: dict[str, np.ndarray]
    fingerprint: str
    rows: int | None = field(default=None)  # None: the inputs do not share a leading size

    def __len__(self) -> int:
        return self.rows if self.rows is not None else 1


def open_data(path: str | os.PathLike, *, kind: str | None) -> Items | Arrays:
    """The items at ``path`` for a model whose pre-processing is of ``kind`` (None: none)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    if p.suffix.lower() == ".npz" and p.is_file():
        arrays = load_npz(p)
        leading = {a.shape[0] for a in arrays.values() if a.ndim}
        rows = leading.pop() if len(leading) == 1 and all(a.ndim for a in arrays.values()) else None
        return Arrays(arrays, _file_fingerprint(p), rows)
    if kind is None:
        raise InputError(
            f"{p}: raw data needs a model that declares its pre-processing "
            "(`modelpress pipeline MODEL -o MODEL --pre ...`); or give an .npz of input arrays"
        )
    if p.is_dir():
        if kind == "text":
            raise InputError(
                f"{p}: a text model reads a .jsonl file (one text a line), not a folder"
            )
        return _folder(p, SUFFIXES[kind])
    if p.suffix.lower() == ".jsonl":
        if kind != "text":
            raise InputError(
                f"{p}: a .jsonl holds texts; this model takes {kind} (give a folder of files)"
            )
        return _jsonl(p)
    raise InputError(
        f"{p}: expected a folder of {kind} files, a .jsonl of texts or an .npz of arrays"
    )


def _folder(root: Path, extensions: tuple[str, ...]) -> Items:
    files = sorted(
        (f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in extensions),
        key=lambda f: f.relative_to(root).as_posix(),
    )
    if not files:
        raise InputError(f"{root}: no {'/'.join(extensions)} files in the folder")
    ids = [f.relative_to(root).as_posix() for f in files]
    h = hashlib.sha256()
    for rel, f in zip(ids, files):
        st = f.stat()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return Items(ids, files, h.hexdigest())


def _jsonl(path: Path) -> Items:
    ids, texts, _, raw = read_jsonl(path)
    return Items(ids, texts, hashlib.sha256(raw).hexdigest())


def _file_fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
