"""Which ops static int8 quantizes, and how values flow through the ones that only move data.

An op is quantized when ONNX Runtime has an integer kernel for it (``eligible``): Conv, Gemm and
MatMul with constant weights; Add and Mul of two activations; global average pools, Sigmoid,
LeakyRelu; HardSigmoid and HardSwish, written as an Add and a Mul that have one. Layout and
selection ops (``PASSTHROUGH_OPS``) share their input's scale, so the runtime drops their Q/DQ and
runs them on the 8-bit data; ``through`` walks past them (and past a Relu/Clip that folds into the
op before it) to the ops that really see a tensor's 8-bit form.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    is_float,
    plain_linear,
)
from modelpress.ir.match import const_array

# Ops with two activation inputs that ONNX Runtime runs in int8 (QLinearAdd, QLinearMul).
BINARY_OPS = {"Add", "Mul"}


# Ops with one activation input and an int8 kernel.
# (Not AveragePool: ONNX Runtime's QLinearAveragePool is far slower than the float kernel.)
# HardSigmoid and HardSwish have none, but are written as ops that do (``_expand_hard``).
HARD_OPS = {"HardSigmoid", "HardSwish"}


UNARY_OPS = {"GlobalAveragePool", "Sigmoid", "LeakyRelu"} | HARD_OPS


# Ops that move or select values without arithmetic: they share their input's scale.
PASSTHROUGH_OPS = {
    "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice",
    "DepthToSpace", "Resize",
}  # fmt: skip


# Ops that read only their input's shape.
SHAPE_ONLY_OPS = {"Shape", "Size"}


def passthrough(node: ir.Node) -> bool:
    """Whether ``node`` only moves or selects values (Resize: nearest-neighbour only)."""
    if node.op_type == "Resize":
        return node.attributes.get_string("mode", "nearest") == "nearest"
    return node.op_type in PASSTHROUGH_OPS


def is_activation(v: ir.Value | None) -> bool:
    return is_float(v) and const_array(v) is None and not v.is_initializer()


def eligible(node: ir.Node) -> bool:
    """Whether ``node`` is an op this mode quantizes, with the inputs its int8 kernel accepts."""
    if node.domain not in ("", "ai.onnx"):
        return False
    op = node.op_type
    if op in WEIGHT_INPUT:
        if len(node.inputs) <= 1 or not is_activation(node.inputs[0]):
            return False
        w = const_array(node.inputs[1])
        if w is None or w.dtype != np.float32 or w.ndim < 2 or (op == "MatMul" and w.ndim != 2):
            return False
        return plain_linear(node)
    if op in BINARY_OPS:
        return len(node.inputs) == 2 and all(is_activation(v) for v in node.inputs)
    if op == "HardSigmoid" and node.attributes.get_float("alpha", 0.2) <= 0:
        return False  # _expand_hard reads the input at α times its scale: α must be positive
    if op in UNARY_OPS:
        return is_activation(node.inputs[0])
    return False


def relu_after(node: ir.Node) -> ir.Node | None:
    """The Relu or Clip(min=0) that is the only consumer of ``node``'s output, if any."""
    y = node.outputs[0]
    uses = list(y.uses())
    if len(uses) != 1 or y.is_graph_output():
        return None
    nxt = uses[0].node
    if nxt.outputs[0].is_graph_output():
        return None
    if nxt.op_type == "Relu":
        return nxt
    if nxt.op_type == "Clip" and len(nxt.inputs) >= 2:
        lo = const_array(nxt.inputs[1])
        if lo is not None and lo.size == 1 and float(lo) == 0.0:
            return nxt
    return None


def reduction_size(node: ir.Node) -> int:
    """Multiply-adds per output element: ``C_in / group · kh · kw`` for Conv, ``K`` for MatMul."""
    w = const_array(node.inputs[1])
    if node.op_type == "Conv":
        return int(np.prod(w.shape[1:]))
    return int(
        w.shape[1]
        if node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
        else w.shape[0]
    )


def is_depthwise(node: ir.Node) -> bool:
    # Depthwise convolutions have their own int8 kernel, fast despite a reduction of only kh·kw.
    return (
        node.op_type == "Conv"
        and node.attributes.get_int("group", 1) > 1
        and const_array(node.inputs[1]).shape[1] == 1
    )


def through(value: ir.Value, forward: bool, *, folds: bool = True) -> list:
    """Walk through scale-sharing ops, and Relu/Clip folds unless ``folds`` is off: the producer
    (backward) or the consumers (forward, None for a graph output) that really see ``value``'s
    8-bit form."""
    skip = ("Relu", "Clip") if folds else ()
    if not forward:
        node = value.producer()
        while node is not None and (passthrough(node) or node.op_type in skip):
            node = node.inputs[0].producer() if node.inputs[0] is not None else None
        return [node]
    out: list = [None] if value.is_graph_output() else []
    for use in value.uses():
        n = use.node
        if use.idx == 0 and (passthrough(n) or n.op_type in skip):
            out.extend(through(n.outputs[0], True, folds=folds))
        else:
            out.append(n)
    return out
