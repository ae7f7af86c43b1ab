"""Graph helpers shared by the quantization modes: copies, lookups, constants, new nodes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.passes._util import add_initializer, const_array, replace_value

__all__ = [
    "add_initializer",
    "const_array",
    "copy_model",
    "replace_value",
    "values_by_name",
    "weight_nodes",
]

# Ops whose constant weight modelpress quantizes, with the weight's input index.
WEIGHT_INPUT = {"Conv": 1, "MatMul": 1, "Gemm": 1}


def copy_model(model: ir.Model) -> ir.Model:
    """A deep copy (through the serialized form: onnx_ir values cannot belong to two graphs)."""
    from modelpress.ir import from_proto, to_proto

    return from_proto(to_proto(model))


def with_types(model: ir.Model) -> ir.Model:
    """``model`` with every value's type inferred (ONNX's own inference through onnx-ir).

    Quantization needs element types, not symbolic shapes, so the cheap standard inference is
    enough; it is best-effort, and a value it cannot type is left for the modes to skip.
    """
    from onnx_ir.passes.common import ShapeInferencePass

    try:
        return ShapeInferencePass(check_type=False, strict_mode=False, data_prop=False)(model).model
    except Exception:  # noqa: BLE001 - inference is best-effort; untyped values are not quantized
        return model


def at_opset(model: ir.Model, need: int, form: str) -> tuple[ir.Model, list[str]]:
    """``model`` at default-domain opset ``need`` or newer, and a note when it had to be upgraded
    (``form``: the quantized form that needs it, for the note and the converter's error)."""
    from modelpress.ir.opset import upgrade_opset

    have = model.opset_imports.get("", 0)
    if have >= need:
        return model, []
    return upgrade_opset(model, need, purpose=form), [
        f"upgraded opset {have} → {need} ({form} needs it)"
    ]


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    out: dict[str, ir.Value] = {v.name: v for v in graph.inputs if v.name}
    out.update({k: v for k, v in graph.initializers.items()})
    for node in graph:
        for v in node.outputs:
            if v.name:
                out[v.name] = v
    return out


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


def remove_unused_initializers(graph: ir.Graph) -> int:
    """Drop initializers nothing reads (the float weights a quantized copy replaced)."""
    unused = [
        name
        for name, v in graph.initializers.items()
        if not v.uses() and not v.is_graph_output() and not v.is_graph_input()
    ]
    for name in unused:
        del graph.initializers[name]
    return len(unused)


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


def swap_node(graph: ir.Graph, node: ir.Node, new_nodes: list[ir.Node], result: ir.Value) -> None:
    """Replace ``node`` (one output) by ``new_nodes``, placed where it was, whose ``result``
    takes over the output: its readers, its type and shape, and its name (so reports and graph
    outputs match the float model's tensors)."""
    old = node.outputs[0]
    result.type, result.shape = old.type, old.shape
    name = old.name
    graph.insert_after(node, new_nodes)
    replace_value(old, result)
    graph.remove(node, safe=True)
    result.name = name
