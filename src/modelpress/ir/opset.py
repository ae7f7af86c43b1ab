"""Opset conversion (upgrade only when the user asks for it)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.defs
import onnx.version_converter
import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir.io import from_proto, to_proto


def upgrade_opset(model: ir.Model, version: int, *, purpose: str | None = None) -> ir.Model:
    """A copy of ``model`` converted to default-domain opset ``version`` (never downgrades).
    ``purpose`` names what needs the new opset in the error when the converter fails (default:
    the ``--opset`` option)."""
    current = model.opset_imports.get("", 0)
    if version < current:
        raise OptionError(
            f"`opset` {version}: the model already uses opset {current}; downgrading is not supported"
        )
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
    for a in node.attribute:
        if a.name == "scales":
            return np.asarray(a.floats)
    if len(node.input) > 1 and node.input[1] in consts:
        return onnx.numpy_helper.to_array(consts[node.input[1]])
    return None


def at_opset(model: ir.Model, need: int, form: str) -> tuple[ir.Model, list[str]]:
    """``model`` at default-domain opset ``need`` or newer, and a note when it had to be upgraded
    (``form``: the quantized form that needs it, for the note and the converter's error)."""
    have = model.opset_imports.get("", 0)
    if have >= need:
        return model, []
    return upgrade_opset(model, need, purpose=form), [
        f"upgraded opset {have} → {need} ({form} needs it)"
    ]


class OpSchema:
    """What an op's schema at one opset says about types: the allowed types of each type
    parameter (``{"T": {"tensor(float)", ...}}``) and the type parameters of its inputs and
    outputs, so callers need not touch ONNX's schema objects."""

    def __init__(self, schema) -> None:
        self.allowed: dict[str, set[str]] = {
            c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints
        }
        self.input_types: list[str] = [p.type_str for p in schema.inputs]
        self.output_types: list[str] = [p.type_str for p in schema.outputs]


def op_schema(op_type: str, opset: int, domain: str = "") -> OpSchema | None:
    """The schema of ``op_type`` in effect at ``opset`` of ``domain``; None for an unknown op."""
    try:
        return OpSchema(onnx.defs.get_schema(op_type, opset, domain or ""))
    except onnx.defs.SchemaError:
        return None


def newest_opset() -> int:
    """The newest default-domain opset this installation of ONNX knows."""
    return onnx.defs.onnx_opset_version()
