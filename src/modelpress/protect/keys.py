"""Keys of protected models: a new 256-bit key on disk, a key read from a file or the environment.

A key is 32 random bytes. ``keygen`` writes them raw to a new file that only its owner may read
(created 0600 and renamed into place, so the key never sits on disk with wider permissions and a
failed write leaves nothing behind); it refuses to overwrite a key, since every package made with
the old one would become unreadable. ``load_key`` reads a key file (the 32 raw bytes, or 64 hex
digits) or an environment variable (64 hex digits). The key id that packages carry is derived
from the key by HMAC, so it identifies a key without revealing anything about it.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from modelpress.errors import ModelSaveError, OptionError

KEY_BYTES = 32
KEY_ID_BYTES = 16


def keygen(path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a new random 256-bit key to ``path`` (owner-only permissions) and return the path."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{p}: output directory {parent} does not exist")
    if p.exists() and not overwrite:
        raise OptionError(
            f"{p}: a file is already there; packages made with that key could no longer be opened "
            "if it were replaced (choose another path, or remove it first)"
        )
    # mkstemp creates the file with mode 0600, so the key is never readable by others.
    fd, tmp = tempfile.mkstemp(prefix=".modelpress-key-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ModelSaveError(f"{p}: could not be written: {exc.strerror or exc}") from None
    return p


def _parse(data: bytes, source: str) -> bytes:
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return binascii.unhexlify(text)
        except binascii.Error:
            pass
    raise OptionError(
        f"{source}: not a key: expected {KEY_BYTES} raw bytes or {2 * KEY_BYTES} hex digits "
        f"(got {len(data)} bytes); make one with `modelpress keygen -o key.bin`"
    )


def load_key(key_file: str | os.PathLike | None = None, key_env: str | None = None) -> bytes:
    """The 32-byte key from ``key_file`` or from the environment variable named ``key_env``
    (exactly one of them)."""
    if key_file is not None and key_env is not None:
        raise OptionError("give the key once: --key-file or --key-env, not both")
    if key_file is not None:
        p = Path(key_file)
        if not p.is_file():
            raise OptionError(f"--key-file {p}: no such file")
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise OptionError(f"--key-file {p}: cannot be read: {exc.strerror or exc}") from None
        return _parse(data, f"--key-file {p}")
    if key_env is not None:
        value = os.environ.get(key_env)
        if not value:
            raise OptionError(f"--key-env {key_env}: the environment variable is not set")
        return _parse(value.encode("ascii", "replace"), f"--key-env {key_env}")
    raise OptionError("this needs a key: give --key-file FILE or --key-env VAR")


def check_key(key: bytes) -> bytes:
    """``key`` when it is a 32-byte key (what the library functions accept), else OptionError."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise OptionError(f"a key is {KEY_BYTES} bytes (load one with modelpress.protect.load_key)")
    return bytes(key)


def key_id(key: bytes) -> bytes:
    """A public fingerprint of ``key`` (HMAC-SHA256 of a fixed label, truncated to 16 bytes)."""
    return hmac.new(check_key(key), b"modelpress key id v1", hashlib.sha256).digest()[:KEY_ID_BYTES]
