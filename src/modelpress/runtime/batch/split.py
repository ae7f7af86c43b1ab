"""Whether a model's batch may be split into smaller batches (or items joined into one) without
changing its answers: only when every output is per-sample along axis 0.

The rule, decided from the graph:

1. every input's axis 0 is dynamic (a name, empty, -1 or 0), and the named ones share one name;
   inputs whose axis 0 all fix the same size ``k`` batch exactly ``k`` items (per-sample when
   the rest of the rule holds with axis 0 taken as the batch; always for ``k = 1``);
2. with axis 0 of every input set to one symbol, shape inference (ONNX Runtime's symbolic
   inference, which follows run-time Reshape shapes) must give every output that symbol on axis 0;
3. no node mixes samples: an op that works across the batch axis (Softmax, a Reduce, Gather,
   TopK, CumSum, Split... with ``axis`` on the batch), an op that looks at the whole tensor
   (NonMaxSuppression, NonZero, Unique, RoiAlign...), or any node that takes the batch axis in
   and gives none out (a MatMul contracting over samples), other than the shape ops.

A model can also say how (``metadata_props["modelpress.batch"]`` = ``per-sample`` or ``whole``),
which wins over the graph. When the rule cannot prove a model per-sample, it is not: a batch
runs whole, items one at a time, and the reason says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import copy_model
from modelpress.ir.match import const_array
from modelpress.ir.shapes import infer_shapes, static_dim

METADATA_KEY = "modelpress.batch"
_SYMBOL = "__modelpress_batch__"

# Ops whose answer for one sample depends on the whole tensor, whatever their attributes.
WHOLE_TENSOR_OPS = {
    "NonMaxSuppression",
    "NonZero",
    "Unique",
    "RoiAlign",
    "MaxRoiPool",
    "Compress",
    "Scan",
    "Loop",
}
# Ops that work along an axis (attribute ``axis``/``axes`` or an ``axes`` input): mixing samples
# when that axis is the batch.
AXIS_OPS = {
    "Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "CumSum", "TopK", "Split", "Gather",
    "GatherElements", "ScatterElements", "LpNormalization", "ReduceSum", "ReduceMean", "ReduceMax",
    "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceSumSquare", "Concat", "Slice", "Trilu", "LayerNormalization", "MeanVarianceNormalization",
}  # fmt: skip
SHAPE_OPS = {"Shape", "Size"}


@dataclass(frozen=True)
class BatchRule:
    per_sample: bool  # batches may be split and items joined
    fixed: int | None  # the batch size every run must have, when the model fixes it
    reason: str  # why not per-sample (empty when it is)

    def to_dict(self) -> dict:
        return {"per_sample": self.per_sample, "fixed": self.fixed, "reason": self.reason}


def batch_rule(model: ir.Model) -> BatchRule:
    """How ``model`` may be batched (see the module docstring)."""
    said = model.metadata_props.get(METADATA_KEY)
    if said in ("per-sample", "whole"):
        return BatchRule(
            said == "per-sample",
            None,
            "" if said == "per-sample" else f"the model says {METADATA_KEY}=whole",
        )
    g = model.graph
    inputs = [v for v in g.inputs if v.name not in g.initializers]
    if not inputs:
        return BatchRule(False, None, "the model has no inputs")
    firsts = []
    for v in inputs:
        if v.shape is None or len(v.shape) == 0:
            return BatchRule(False, None, f"input {v.name!r} has no batch axis")
        firsts.append(v.shape[0])
    fixed = {static_dim(d) for d in firsts}
    if fixed != {None}:
        if len(fixed) != 1:
            return BatchRule(False, None, "the inputs' first dimensions are not all dynamic")
        k = fixed.pop()
        if k == 1:  # one sample a run: nothing to mix
            return BatchRule(True, 1, "")
        reason = _mixing(model)
        return BatchRule(not reason, k, reason)
    names = {d.value for d in firsts if isinstance(d, ir.SymbolicDim) and d.value}
    if len(names) > 1:
        return BatchRule(
            False,
            None,
            f"the inputs' first dimensions have different names ({', '.join(sorted(names))})",
        )
    reason = _mixing(model)
    return BatchRule(not reason, None, reason)


def _mixing(model: ir.Model) -> str:
    """Why the batch axis is not per-sample through the graph ('' when it is)."""

    probe = copy_model(model)
    g = probe.graph
    for v in g.inputs:
        if v.name not in g.initializers:
            v.shape = ir.Shape([_SYMBOL, *v.shape[1:]])
    shaped = infer_shapes(probe)

    def batch_axes(v: ir.Value | None) -> list[int]:
        if v is None or v.shape is None:
            return []
        return [
            i for i, d in enumerate(v.shape) if isinstance(d, ir.SymbolicDim) and d.value == _SYMBOL
        ]

    def carries(v: ir.Value | None) -> bool:
        return v is not None and v.shape is not None and any(_SYMBOL in str(d) for d in v.shape)

    for node in shaped.graph:
        what = f"{node.op_type} {node.name or node.outputs[0].name!r}"
        if any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for a in node.attributes.values()
        ):
            return f"{what} has a subgraph, which this rule does not look into"
        ins = [v for v in node.inputs if carries(v)]
        if not ins or node.op_type in SHAPE_OPS:
            continue
        if node.op_type in WHOLE_TENSOR_OPS:
            return f"{what} works on the whole batch"
        if node.op_type in AXIS_OPS:
            data = node.inputs if node.op_type == "Concat" else node.inputs[:1]
            for axis in _axes(node):
                for v in data:
                    if (
                        v is not None
                        and v.shape is not None
                        and axis % len(v.shape) in batch_axes(v)
                    ):
                        return f"{what} works across samples (axis {axis})"
        outs = [o for o in node.outputs if o.name]
        if outs and not any(batch_axes(o) for o in outs):
            return f"{what} does not keep the batch axis"
    for out in shaped.graph.outputs:
        if 0 not in batch_axes(out):
            return f"output {out.name!r} is not per-sample along axis 0 (shape {_show(out.shape)})"
    return ""


def _axes(node: ir.Node) -> list[int]:
    """The axes ``node`` works along: its attribute, its constant axes input, or its default;
    every axis when they come from a value known only at run time (assume the worst)."""
    data = node.inputs[0]
    rank = len(data.shape) if data is not None and data.shape is not None else 1
    if node.op_type == "Trilu":
        return [-2, -1]
    attr = node.attributes.get("axes") or node.attributes.get("axis")
    if attr is not None:
        value = attr.value
        axes = list(value) if isinstance(value, (list, tuple)) else [int(value)]
        if node.op_type == "LayerNormalization":  # normalises from its axis to the last
            return list(range(axes[0] % rank, rank))
        return axes
    slot = {"CumSum": 1, "Slice": 3}.get(
        node.op_type, 1 if node.op_type.startswith("Reduce") else None
    )
    if slot is not None:
        axes = const_array(node.inputs[slot]) if len(node.inputs) > slot else None
        if axes is not None:
            return [int(a) for a in axes.reshape(-1)]
        return list(range(rank))
    defaults = {
        "MeanVarianceNormalization": [0, 2, 3],
        "LayerNormalization": list(range(rank - 1, rank)),
    }
    return defaults.get(
        node.op_type,
        [
            -1
            if node.op_type in ("Softmax", "LogSoftmax", "Hardmax", "TopK", "LpNormalization")
            else 0
        ],
    )


def _show(shape) -> str:
    if shape is None:
        return "unknown"
    return "[" + ", ".join("batch" if _SYMBOL in str(d) else str(d) for d in shape) + "]"
