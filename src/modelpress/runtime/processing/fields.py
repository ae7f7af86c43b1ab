"""Reading a declaration's fields: from the command line (``image:resize=256,crop=224``), from a
JSON/YAML file, or from the model's metadata, into typed values.

Every error names the field as ``pre.<key>`` or ``post.<key>`` (the same words in all three
sources), so a user can find it whichever way they wrote it.

Command-line syntax: ``KEY=VALUE`` items separated by commas. An item without ``=`` is a flag when
it is one of the kind's keys (``softmax``), and otherwise one more value of the key before it, so
lists read naturally: ``mean=0.485,0.456,0.406,std=0.229,0.224,0.225``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelpress.errors import InputError, OptionError

Converter = Callable[[str, Any], Any]


def fail(field: str, message: str) -> OptionError:
    """The one-line error for a field of a declaration."""
    return OptionError(f"{field}: {message}")


def split_items(text: str, keys: set[str], *, where: str) -> dict[str, Any]:
    """``"a=1,b=2,3,flag"`` into ``{"a": "1", "b": ["2", "3"], "flag": True}`` (see module doc)."""
    raw: dict[str, Any] = {}
    last: str | None = None
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep:
            if key in raw:
                raise fail(f"{where}.{key}", "given twice")
            raw[key] = value.strip()
            last = key
        elif key in keys or last is None:
            raw[key] = True
            last = None
        else:  # one more value of the list being read
            prev = raw[last]
            raw[last] = [*prev, item] if isinstance(prev, list) else [prev, item]
    return raw


def check_keys(raw: dict[str, Any], keys: set[str] | dict, *, where: str) -> None:
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"unknown key; known keys: {', '.join(sorted(keys))}")


def as_bool(field: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise fail(field, f"expected true or false, got {v!r}")


def as_int(field: str, v: Any, *, minimum: int = 1) -> int:
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        n = int(v)
    except (TypeError, ValueError):
        raise fail(field, f"expected an integer, got {v!r}") from None
    if n < minimum:
        raise fail(field, f"must be at least {minimum}, got {n}")
    return n


def as_float(field: str, v: Any) -> float:
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise fail(field, f"expected a number, got {v!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise fail(field, f"expected a finite number, got {v!r}")
    return x


def as_floats(field: str, v: Any) -> tuple[float, ...]:
    """One number or a list of them (a list, or a string ``"a b c"``/``"a:b:c"``)."""
    if isinstance(v, str):
        v = v.replace(":", " ").replace("/", " ").split()
    items = v if isinstance(v, (list, tuple)) else [v]
    if not items:
        raise fail(field, "expected at least one number")
    return tuple(as_float(field, x) for x in items)


def as_size(field: str, v: Any) -> tuple[int, ...]:
    """``256`` (one number) or ``HxW`` (``"224x192"`` or ``[224, 192]``)."""
    if isinstance(v, str):
        parts = v.lower().split("x")
    elif isinstance(v, (list, tuple)):
        parts = list(v)
    else:
        parts = [v]
    if len(parts) not in (1, 2):
        raise fail(field, f"expected N or HxW, got {v!r}")
    try:
        return tuple(as_int(field, p) for p in parts)
    except OptionError:
        raise fail(field, f"expected N or HxW with positive integers, got {v!r}") from None


def as_choice(choices: tuple[str, ...]) -> Converter:
    def convert(field: str, v: Any) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise fail(field, f"expected one of {', '.join(choices)}, got {v!r}")
        return s

    return convert


def as_name(field: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise fail(field, f"expected a name, got {v!r}")
    return v


def read_text_file(field: str, v: Any, base: Path | None) -> str:
    """The content of the file a field names (relative to ``base``, the declaration's folder)."""
    if not isinstance(v, str) or not v:
        raise fail(field, f"expected a file path, got {v!r}")
    path = Path(v)
    if base is not None and not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise fail(field, f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(field, f"{path}: cannot be read as UTF-8 text ({type(exc).__name__})") from None


def convert_fields(
    raw: dict[str, Any], converters: dict[str, Converter], *, where: str
) -> dict[str, Any]:
    """Each known key of ``raw`` through its converter; an unknown key is refused by name."""
    check_keys(raw, converters, where=where)
    return {k: converters[k](f"{where}.{k}", v) for k, v in raw.items() if v is not None}


def read_item(item: bytes | os.PathLike, *, label: str, kind: str) -> bytes:
    """The bytes of one image or audio item: given as bytes, or read from a path."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, os.PathLike):
        try:
            with open(item, "rb") as f:
                return f.read()
        except OSError as exc:
            raise InputError(
                f"{label}: cannot be read ({exc.strerror or type(exc).__name__})"
            ) from None
    # A string is not taken as a path: a server would otherwise open any file a client names.
    raise InputError(f"{label}: an {kind} model takes the file's bytes, got {type(item).__name__}")
