"""FLOPs and bytes of every node of an ONNX model at concrete input shapes.

Shapes come from ONNX shape inference after the inputs are fixed (``--shape``). FLOPs count a
multiply-add as 2. Bytes are what a node reads (activations and weights) and writes, each tensor
once: a lower bound on memory traffic. Ops whose cost is unknown count as elementwise on their
output (one FLOP per element), a floor that keeps totals honest for glue ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.match import GLOBAL_POOLS, REDUCTIONS, static_shape
from modelpress.ir.shapes import infer_shapes
from modelpress.ir.stats import iter_nodes

# Pools over a sliding window (one op per output element and kernel element), and ops that reduce
# whole axes (one op per input element); the workload's kinds (``workload``) reuse both.
WINDOW_POOLS = ("MaxPool", "AveragePool", "LpPool")
WHOLE_REDUCTIONS = (*GLOBAL_POOLS, *REDUCTIONS)


@dataclass(frozen=True)
class NodeCost:
    name: str
    op_type: str
    flops: float
    weight_bytes: int
    activation_bytes: int  # activations read + written
    output_shape: tuple | None
    # Element counts behind the two byte figures, so a planner can re-price them at another
    # precision (an fp32 graph planned for fp16 moves half the bytes, not the same bytes).
    weight_elems: int = 0
    activation_elems: int = 0

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass(frozen=True)
class ModelCost:
    nodes: list[NodeCost]
    unknown_shapes: int  # nodes whose shapes inference could not resolve

    @property
    def flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    @property
    def bytes(self) -> int:
        return sum(n.bytes for n in self.nodes)

    @property
    def weight_bytes(self) -> int:
        return sum(n.weight_bytes for n in self.nodes)


def _numel(shape) -> int:
    return int(math.prod(shape)) if shape is not None else 0


def _itemsize(value: ir.Value | None) -> int:
    if value is None or value.dtype is None:
        return 4
    try:
        return max(value.dtype.itemsize, 1)
    except (AttributeError, TypeError, ValueError):
        return 4


def _bytes(value: ir.Value | None) -> int:
    return _numel(static_shape(value)) * _itemsize(value) if static_shape(value) is not None else 0


def _elems(value: ir.Value | None) -> int:
    return _numel(static_shape(value)) if static_shape(value) is not None else 0


def _is_weight(value: ir.Value | None) -> bool:
    return value is not None and (value.const_value is not None or value.is_initializer())


# Elementwise FLOPs per output element for ops more expensive than one operation.
_ELEMENTWISE_COST = {
    "Erf": 8,
    "Tanh": 8,
    "Sigmoid": 4,
    "Exp": 4,
    "Log": 4,
    "Gelu": 8,
    "HardSwish": 3,
    "HardSigmoid": 2,
    "Softplus": 4,
    "Pow": 4,
    "Sqrt": 2,
    "Reciprocal": 1,
    "Mish": 10,
    "Swish": 5,
    "Elu": 4,
    "Selu": 4,
}


def _node_flops(node: ir.Node) -> float:
    op = node.op_type
    out = static_shape(node.outputs[0]) if node.outputs else None
    ins = [static_shape(v) for v in node.inputs]
    if op in ("Conv", "ConvInteger", "QLinearConv", "FusedConv"):
        w = ins[1] if op != "QLinearConv" else ins[3]
        if out is None or w is None:
            return 0.0
        macs = _numel(out) * math.prod(w[1:])  # each output: C_in/group × kernel MACs
        bias = (
            _numel(out)
            if len(node.inputs) > 2 and node.inputs[2] is not None and op == "Conv"
            else 0
        )
        return 2.0 * macs + bias
    if op == "ConvTranspose":
        x, w = ins[0], ins[1]
        if x is None or w is None:
            return 0.0
        # every input element scatters into C_out/group × kernel outputs
        group = node.attributes.get_int("group", 1)
        return 2.0 * _numel(x) * (w[1] * group // max(group, 1)) * math.prod(w[2:])
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul", "MatMulNBits"):
        a = ins[0]
        if out is None or a is None:
            return 0.0
        k = a[-1]
        return 2.0 * _numel(out) * k
    if op == "Gemm":
        a = ins[0]
        if out is None or a is None:
            return 0.0
        k = a[0] if node.attributes.get_int("transA", 0) else a[-1]
        return 2.0 * _numel(out) * k + (_numel(out) if len(node.inputs) > 2 else 0)
    if op in WINDOW_POOLS:
        kernel = node.attributes.get_ints("kernel_shape", [1])
        return float(_numel(out) * math.prod(kernel))
    if op in WHOLE_REDUCTIONS:
        return float(_numel(ins[0])) if ins and ins[0] else 0.0
    if op in ("BatchNormalization", "InstanceNormalization"):
        return 2.0 * _numel(out)
    if op in (
        "LayerNormalization",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "GroupNormalization",
    ):
        return 8.0 * _numel(out)
    if op in ("Softmax", "LogSoftmax"):
        return 5.0 * _numel(out)
    if op in ("Attention", "MultiHeadAttention"):
        # packed attention: QKV projection is separate; cost here is QK^T and AV for (B, S, H)
        x = ins[0]
        if x is None or len(x) != 3:
            return 0.0
        b, s, h = x
        return 4.0 * b * s * s * h
    if op in (
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Shape",
        "Constant",
        "Identity",
        "Size",
        "Transpose",
        "Concat",
        "Slice",
        "Gather",
        "Split",
        "Expand",
        "Cast",
        "Tile",
        "Pad",
        "ConstantOfShape",
        "Range",
        "If",
        "Loop",
        "Scan",
        "QuantizeLinear",
        "DequantizeLinear",
    ):
        return 0.0 if op not in ("QuantizeLinear", "DequantizeLinear") else 2.0 * _numel(out)
    return float(_ELEMENTWISE_COST.get(op, 1) * _numel(out))


def profile_model(model: ir.Model, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelCost:
    """Cost of every node (subgraph nodes included, counted once) at the given input shapes."""
    inferred = infer_shapes(model, shapes)
    costs = []
    unknown = 0
    for node in iter_nodes(inferred.graph):
        if node.op_type == "Constant":
            continue
        out = static_shape(node.outputs[0]) if node.outputs else None
        if out is None and node.outputs:
            unknown += 1
        weight = sum(_bytes(v) for v in node.inputs if _is_weight(v))
        acts = sum(_bytes(v) for v in node.inputs if v is not None and not _is_weight(v))
        acts += sum(_bytes(v) for v in node.outputs)
        costs.append(
            NodeCost(
                name=node.name or "",
                op_type=node.op_type,
                flops=_node_flops(node),
                weight_bytes=weight,
                activation_bytes=acts,
                output_shape=out,
                weight_elems=sum(_elems(v) for v in node.inputs if _is_weight(v)),
                activation_elems=sum(
                    _elems(v) for v in node.inputs if v is not None and not _is_weight(v)
                )
                + sum(_elems(v) for v in node.outputs),
            )
        )
    return ModelCost(nodes=costs, unknown_shapes=unknown)


__all__ = ["ModelCost", "NodeCost", "profile_model"]
