"""The layers quantization works on: Conv/MatMul/Gemm with constant float weights, embedding
tables, and the axes of their weights."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer
from modelpress.ir.match import const_array

# Ops whose constant weight modelpress quantizes, with the weight's input index.
WEIGHT_INPUT = {"Conv": 1, "MatMul": 1, "Gemm": 1}


def is_float(value: ir.Value | None) -> bool:
    return value is not None and value.dtype == ir.DataType.FLOAT


def weight_nodes(graph: ir.Graph) -> list[ir.Node]:
    """Conv/MatMul/Gemm nodes of the default domain whose weight is a float constant of rank ≥ 2."""
    out = []
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in WEIGHT_INPUT:
            continue
        idx = WEIGHT_INPUT[node.op_type]
        if len(node.inputs) <= idx:
            continue
        w = const_array(node.inputs[idx])
        if w is None or w.dtype != np.float32 or w.ndim < 2:
            continue
        if node.op_type == "MatMul" and w.ndim != 2:
            continue  # batched weights: per-channel axes would not map to output features
        out.append(node)
    return out


def plain_linear(node: ir.Node) -> bool:
    """A MatMul, or a Gemm that is one: no transA, alpha = beta = 1, and a constant 1-D bias if any.

    Integer kernels compute ``A @ B + bias`` only; anything else would need float work around them.
    """
    if node.op_type == "Gemm":
        a = node.attributes
        if (
            a.get_int("transA", 0)
            or a.get_float("alpha", 1.0) != 1.0
            or a.get_float("beta", 1.0) != 1.0
        ):
            return False
    if node.op_type in ("Gemm", "Conv") and len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = const_array(node.inputs[2])
        if bias is None or bias.ndim != 1:
            return False
    return True


def output_channel_axis(node: ir.Node) -> int:
    """The axis of the weight that indexes output features (the per-channel axis)."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        return 0 if node.attributes.get_int("transB", 0) else 1
    return 1  # MatMul: W is [K, N]


def input_channel_axis(node: ir.Node) -> int:
    """The axis of the weight that indexes input features (the reduction axis)."""
    if node.op_type == "Conv":
        return 1
    if node.op_type == "Gemm":
        return 1 if node.attributes.get_int("transB", 0) else 0
    return 0


def constant(graph: ir.Graph, array: np.ndarray, hint: str) -> ir.Value:
    return add_initializer(graph, np.asarray(array), hint)


def is_channel_constant(arr: np.ndarray | None, c: int) -> bool:
    """A float32 constant of ``c`` values along NCHW's channel axis: ``[c,1,1]`` or ``[1,c,1,1]``."""
    return (
        arr is not None
        and arr.dtype == np.float32
        and arr.size == c
        and arr.shape in ((c, 1, 1), (1, c, 1, 1))
    )


def scalar_or_vector(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    return arr.reshape(()) if arr.size == 1 and arr.ndim <= 1 else arr


def gather_tables(graph: ir.Graph, *, min_size: int = 0) -> list[ir.Node]:
    """Gathers along axis 0 of a constant 2-D float32 table (embeddings) of at least ``min_size``
    elements: the weights of the lookup layers that quantization stores as integer rows."""
    out = []
    for node in graph:
        if (
            node.op_type == "Gather"
            and node.domain in ("", "ai.onnx")
            and node.attributes.get_int("axis", 0) == 0
        ):
            t = const_array(node.inputs[0])
            if t is not None and t.dtype == np.float32 and t.ndim == 2 and t.size >= min_size:
                out.append(node)
    return out
