"""Opset conversion (upgrade only when the user asks for it)."""

from __future__ import annotations

import onnx
import onnx.version_converter
import onnx_ir as ir

from modelpress.errors import OptionError


def upgrade_opset(model: ir.Model, version: int, *, purpose: str | None = None) -> ir.Model:
    """A copy of ``model`` converted to default-domain opset ``version`` (never downgrades).
    ``purpose`` names what needs the new opset in the error when the converter fails (default:
    the ``--opset`` option)."""
    from modelpress.ir.io import from_proto, to_proto

    current = model.opset_imports.get("", 0)
    if version < current:
        raise OptionError(f"--opset {version}: the model already uses opset {current}; downgrading is not supported")
    if version == current:
        return model
    source = to_proto(model)
    try:
        proto = onnx.version_converter.convert_version(source, version)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError with long texts
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        need = f"--opset {version}" if purpose is None else f"{purpose} needs opset {version}, but"
        raise OptionError(f"{need}: ONNX's converter cannot upgrade this model: {first}") from None
    if current < 11 <= version:
        _keep_legacy_resize(source.graph, proto.graph)
    return from_proto(proto)


def _keep_legacy_resize(before: onnx.GraphProto, after: onnx.GraphProto) -> None:
    """Resize-10 and Upsample map output pixel ``i`` to input ``i / scale`` (asymmetric) and, in
    nearest mode, round that down when upsampling and up when downsampling (ONNX Runtime's
    behaviour). The converter writes a Resize-11 with the defaults instead (half-pixel centres,
    round to nearest), which moves a linear upsampling by up to the input's range. Set the
    attributes that keep the old result, on each converted node in graph order."""
    old = [n for n in before.node if n.op_type in ("Upsample", "Resize")]
    new = [n for n in after.node if n.op_type == "Resize"]
    if len(old) != len(new):
        return
    consts = {t.name: t for t in before.initializer}
    for o, n in zip(old, new):
        mode = next((a.s.decode() for a in o.attribute if a.name == "mode"), "nearest")
        attrs = {"coordinate_transformation_mode": "asymmetric"}
        if mode == "nearest":
            scales = _scales(o, consts)
            down = scales is not None and bool((scales <= 1).all() and (scales < 1).any())
            attrs["nearest_mode"] = "ceil" if down else "floor"
        kept = [a for a in n.attribute if a.name not in attrs]
        del n.attribute[:]
        n.attribute.extend(kept + [onnx.helper.make_attribute(k, v) for k, v in attrs.items()])


def _scales(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto]):
    """A legacy resize's scales when they are constant (an attribute or an initializer)."""
    import numpy as np

    for a in node.attribute:
        if a.name == "scales":
            return np.asarray(a.floats)
    if len(node.input) > 1 and node.input[1] in consts:
        return onnx.numpy_helper.to_array(consts[node.input[1]])
    return None
