"""The signature of an obfuscated model: a MAC under the key over everything the file holds.

An obfuscated model written without encryption (``--no-encrypt``) is an ordinary ONNX file: its
operator library is sealed, but its graph and its stored weights are in the clear, and a changed
weight, a graph edited by hand or a library taken from another model protected with the same key
would otherwise run, silently wrong. So every obfuscated model carries, in its metadata
(``SIGNATURE_META``), an HMAC-SHA256 of its serialized form without that entry, under a key
derived from the user's key (HKDF-SHA256, its own label: the MAC key is never the encryption key).
``check`` recomputes it and refuses anything that differs, in one line.

The bytes signed are the model's canonical serialization: the in-memory model serialized, read
back and serialized again (onnx_ir's round trip is a fixed point from then on), so the writer and
every reader sign exactly the same bytes whatever produced the file.
"""

from __future__ import annotations

import hashlib
import hmac

import onnx_ir as ir

from modelpress.ir import from_bytes, model_bytes
from modelpress.protect.keys import check_key
from modelpress.protect.package import WRONG_KEY, PackageError

SIGNATURE_META = "modelpress.signature"
_LABEL = b"modelpress obfuscated model signature v1"


def _mac_key(key: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(check_key(key))


def _digest(model: ir.Model, key: bytes) -> str:
    props = model.metadata_props
    saved = props.pop(SIGNATURE_META, None)
    try:
        data = model_bytes(model)
    finally:
        if saved is not None:
            props[SIGNATURE_META] = saved
    return hmac.new(_mac_key(key), data, hashlib.sha256).hexdigest()


def sign(model: ir.Model, key: bytes) -> ir.Model:
    """``model`` in its canonical form (a new model), signed with ``key``."""
    model.metadata_props.pop(SIGNATURE_META, None)
    canonical = from_bytes(model_bytes(model), source="the obfuscated model")
    canonical.metadata_props[SIGNATURE_META] = _digest(canonical, key)
    return canonical


def check(model: ir.Model, key: bytes, *, name: str) -> None:
    """PackageError unless ``model`` carries a valid signature under ``key``."""
    found = model.metadata_props.get(SIGNATURE_META)
    if found is None:
        raise PackageError(
            f"{name}: the obfuscated model is not signed (changed, or made by an older modelpress): refused"
        )
    if not hmac.compare_digest(found, _digest(model, key)):
        raise PackageError(f"{name}: {WRONG_KEY} (its signature does not match its contents)")
