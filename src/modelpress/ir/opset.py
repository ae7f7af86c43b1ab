"""Opset conversion (upgrade only when the user asks for it)."""

from __future__ import annotations

import onnx
import onnx.version_converter
import onnx_ir as ir

from modelpress.errors import OptionError


def upgrade_opset(model: ir.Model, version: int) -> ir.Model:
    """A copy of ``model`` converted to default-domain opset ``version`` (never downgrades)."""
    from modelpress.ir.io import from_proto, to_proto

    current = model.opset_imports.get("", 0)
    if version < current:
        raise OptionError(f"--opset {version}: the model already uses opset {current}; downgrading is not supported")
    if version == current:
        return model
    try:
        proto = onnx.version_converter.convert_version(to_proto(model), version)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError with long texts
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise OptionError(f"--opset {version}: ONNX's converter cannot upgrade this model: {first}") from None
    return from_proto(proto)
