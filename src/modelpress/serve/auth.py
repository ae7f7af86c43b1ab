"""Bearer-key authentication: every call but health needs ``Authorization: Bearer KEY``.

The key is compared in constant time (``hmac.compare_digest`` on bytes), so the time a refusal
takes says nothing about how much of a guessed key was right. Health endpoints stay open for load
balancers and orchestrators, which probe them without credentials.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from modelpress.errors import OptionError

OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")


def read_key_file(path: str | os.PathLike) -> str:
    """The key in ``path`` (surrounding whitespace removed); OptionError when missing or empty."""
    p = Path(path)
    try:
        key = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(
            f"--api-key-file {p}: cannot read it ({exc.__class__.__name__})"
        ) from None
    if not key:
        raise OptionError(f"--api-key-file {p}: the file is empty; put the key on its first line")
    if any(c.isspace() for c in key):
        raise OptionError(f"--api-key-file {p}: the key must be one word without spaces")
    return key


def authorized(header: str | None, key: str) -> bool:
    """True when the ``Authorization`` header carries ``Bearer <key>``."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), key.encode())
