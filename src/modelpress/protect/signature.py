"""The signature of an obfuscated model: a MAC under the key over everything the file holds.

An obfuscated model written without encryption (``--no-encrypt``) is an ordinary ONNX file: its
operator library is sealed, but its graph and its stored weights are in the clear, and a changed
weight, a graph edited by hand or a library taken from another model protected with the same key
would otherwise run, silently wrong. So every obfuscated model carries, in its metadata
(``SIGNATURE_META``), an HMAC-SHA256 of its serialized form without that entry, under a key
derived from the user's key (HKDF-SHA256, its own label: the MAC key is never the encryption key).
``check`` recomputes it and refuses anything that differs, in one line.

The bytes signed are the model's payload stream (``payload.model_stream``: the ModelProto with
its big tensors as references, then those tensors' bytes), streamed into the MAC without a copy
of the model; the writer first gives each initializer its tensor's type, as a reader does, so
both sign exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac

import onnx_ir as ir

from modelpress.protect import payload
from modelpress.protect.keys import check_key
from modelpress.protect.package import WRONG_KEY, PackageError

SIGNATURE_META = "modelpress.signature"
_LABEL = b"modelpress obfuscated model signature v1"


def _mac_key(key: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(check_key(key))


def _digest(model: ir.Model, key: bytes) -> str:
    """HMAC of the model's payload stream (``payload.model_stream``: a small ModelProto, then the
    big tensors' bytes), the signature entry left out: no copy of the model is made."""
    props = model.metadata_props
    saved = props.pop(SIGNATURE_META, None)
    mac = hmac.new(_mac_key(key), digestmod=hashlib.sha256)
    try:
        _, segments = payload.model_stream(model)
        for segment in segments:
            mac.update(segment)
    finally:
        if saved is not None:
            props[SIGNATURE_META] = saved
    return mac.hexdigest()


def _as_read(model: ir.Model) -> None:
    """Give each initializer the type and shape of its tensor, as reading a file does, so that
    the model serializes the same before it is written and after it is read."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            t = value.const_value
            if t is not None:
                value.type = ir.TensorType(t.dtype)
                value.shape = ir.Shape(t.shape)


def sign(model: ir.Model, key: bytes) -> ir.Model:
    """``model`` (itself) signed with ``key``."""
    model.metadata_props.pop(SIGNATURE_META, None)
    _as_read(model)
    model.metadata_props[SIGNATURE_META] = _digest(model, key)
    return model


def check(model: ir.Model, key: bytes, *, name: str) -> None:
    """PackageError unless ``model`` carries a valid signature under ``key``."""
    found = model.metadata_props.get(SIGNATURE_META)
    if found is None:
        raise PackageError(
            f"{name}: the obfuscated model is not signed (changed, or made by an older modelpress): refused"
        )
    if not hmac.compare_digest(found, _digest(model, key)):
        raise PackageError(f"{name}: {WRONG_KEY} (its signature does not match its contents)")
