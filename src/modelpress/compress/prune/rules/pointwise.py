"""Rules for ops that keep their input's layout: unary ops, pooling, normalizations, softmax and
broadcast elementwise arithmetic. The units pass through; a per-channel constant (a norm's scale,
an elementwise operand) is sliced with them; a normalization across the units refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune.depgraph import param
from modelpress.compress.prune.registry import Refuse, norm_axis, rule
from modelpress.ir.match import BROADCASTING, attr

if TYPE_CHECKING:
    from modelpress.compress.prune.analyzer import Analyzer


_UNARY = (
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Softplus",
    "Softsign",
    "Gelu",
    "Erf",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Abs",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
    "Cos",
    "Sin",
    "Not",
    "Identity",
    "Dropout",
    "Cast",
    "CastLike",
    "Clip",
    "IsNaN",
    "IsInf",
    "Mish",
    "ThresholdedRelu",
    "Shrink",
)


@rule(*_UNARY)
def _unary(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    if t is None:
        raise Refuse
    for v in node.inputs[1:]:  # Clip bounds, CastLike's example: scalars or types only
        if v is not None and v.name in a.g.tracks:
            raise Refuse
        if v is not None and node.op_type == "Clip" and int(np.prod(a.shape(v))) > 1:
            raise Refuse
    a.new(y, t.axis, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)


@rule("QuantizeLinear", "DequantizeLinear")
def _qdq(a: Analyzer, node: ir.Node) -> None:
    for v in node.inputs[1:]:
        if v is not None and int(np.prod(a.shape(v))) > 1:
            raise Refuse  # per-channel parameters are not followed
    _unary(a, node)


@rule("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _pool(a: Analyzer, node: ir.Node) -> None:
    t = a.track(node.inputs[0])
    if (
        t is None
        or t.axis != 1
        or (len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses())
    ):
        raise Refuse
    _unary(a, node)


@rule("BatchNormalization", "InstanceNormalization")
def _channel_norm(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    if (
        t is None
        or t.axis != 1
        or any(o is not None and o.name and o.uses() for o in node.outputs[1:])
    ):
        raise Refuse
    a.new(y, 1, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)
    roles = ["scale", "shift", "stat", "stat"]
    for i in range(1, len(node.inputs)):
        if node.inputs[i] is not None:
            a.slice(node, i, 0, y, roles[i - 1])


@rule("LayerNormalization")
def _layer_norm(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    t = a.track(x)
    rank = len(a.shape(x))
    axis = norm_axis(int(attr(node, "axis", -1)), rank)
    if t is None or any(o is not None and o.name and o.uses() for o in node.outputs[1:]):
        raise Refuse
    a.new(y, t.axis, t.units, kind=a.g.kinds.get(x.name))
    a.link(x, y)
    if t.axis >= axis:  # the normalized features themselves: their scale and bias follow them
        for i in (1, 2):
            if i < len(node.inputs) and node.inputs[i] is not None:
                p = param(node.inputs[i])
                if p is None:
                    raise Refuse
                # the parameter broadcasts against x.shape[axis:], aligned to the right
                k = t.axis - rank + p.ndim
                if 0 <= k < p.ndim and p.shape[k] != 1:
                    a.slice(node, i, k, y, "norm")


@rule("Softmax", "LogSoftmax", "Hardmax")
def _softmax(a: Analyzer, node: ir.Node) -> None:
    t = a.track(node.inputs[0])
    rank = len(a.shape(node.inputs[0]))
    opset = a.model.opset_imports.get("", a.model.opset_imports.get("ai.onnx", 13))
    axis = norm_axis(int(attr(node, "axis", -1 if opset >= 13 else 1)), rank)
    old_style = opset < 13
    if t is None or t.axis == axis or (old_style and t.axis >= axis):
        raise Refuse  # a normalization across the units themselves
    _unary(a, node)


@rule(*BROADCASTING)
def _elementwise(a: Analyzer, node: ir.Node) -> None:
    y = node.outputs[0]
    r = len(a.shape(y))
    out_axis, units = None, None
    tracked = []
    for v in node.inputs:
        t = a.track(v)
        if t is None:
            continue
        ax = t.axis + r - len(a.shape(v))
        if out_axis is None:
            out_axis, units = ax, t.units
        elif ax != out_axis or t.units != units:
            raise Refuse
        tracked.append(v)
    kind = next((a.g.kinds.get(v.name) for v in tracked if a.g.kinds.get(v.name)), None)
    a.new(y, out_axis, units, kind=kind)
    for v in tracked:
        a.link(v, y)
    for i, v in enumerate(node.inputs):
        if v is None or v.name in a.g.tracks:
            continue
        sv = a.shape(v)
        k = out_axis - (r - len(sv))
        if k < 0 or sv[k] == 1:
            continue
        if param(v) is None:
            raise Refuse  # a computed tensor with channels nobody tracks
        a.slice(node, i, k, y, "param")
