"""Atomic writes: every file modelpress writes appears whole or not at all.

A file is written under a temporary name in its target's folder and renamed into place, so a failed
or interrupted command never leaves a partial file and never touches the one already there. The
folder must exist; a command checks that (``output_dir``) before its work, not after.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from modelpress.errors import InputError, ModelpressError, ModelSaveError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def output_dir(path: str | os.PathLike) -> Path:
    """The folder ``path`` will be written in; ``ModelSaveError`` when it does not exist."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{p}: output directory {parent} does not exist")
    return parent


@contextmanager
def staging_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside ``path`` for the files that will replace it (a model and its
    external data); removed on exit, with whatever the caller did not move out of it."""
    p = Path(path)
    parent = output_dir(p)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".modelpress-", dir=parent))
    except OSError as exc:
        raise ModelSaveError(f"{p}: cannot write to {parent}: {_first_line(exc)}") from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """An open file whose content replaces ``path`` when the block ends without an error."""
    p = Path(path)
    with staging_dir(p) as tmp:
        staged = tmp / p.name
        try:
            with open(staged, mode) as f:
                yield f
            os.replace(staged, p)
        except OSError as exc:
            raise ModelSaveError(f"{p}: could not be written: {_first_line(exc)}") from None
    return


def replace_folder(stage: Path, output: Path) -> None:
    """Move the finished folder ``stage`` to ``output`` (same file system), replacing the folder
    there, if any, only once the new one is in place; on failure the old one is put back."""
    old = None
    try:
        if output.exists():
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            os.replace(output, old)
        os.replace(stage, output)
    except OSError as exc:
        if old is not None and not output.exists():
            os.replace(old, output)
        raise ModelSaveError(f"{output}: could not be written: {_first_line(exc)}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic(path) as f:
        f.write(data)
    return Path(path)


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """``data`` as indented JSON (numpy scalars and arrays, sets, tuples and paths converted)."""
    with atomic(path, "w") as f:
        json.dump(data, f, indent=2, default=_json_default)
        f.write("\n")
    return Path(path)


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> Path:
    with atomic(path) as f:
        np.savez(f, **arrays)
    return Path(path)


def existing_file(
    path: str | os.PathLike, *, what: str, error: type[ModelpressError] = InputError
) -> Path:
    """``path`` when a file is there, else one ``error`` line: no such file, or a directory where
    ``what`` (say "an .npz file") was expected."""
    p = Path(path)
    if not p.exists():
        raise error(f"{p}: no such file")
    if p.is_dir():
        raise error(f"{p}: is a directory, expected {what}")
    return p


def read_json(path: str | os.PathLike, *, what: str = "JSON file"):
    """The parsed content of a JSON file, or one ``InputError`` line naming the file and ``what``
    it should have been."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{p}: not a {what} ({_first_line(exc)[:120]})") from None


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
