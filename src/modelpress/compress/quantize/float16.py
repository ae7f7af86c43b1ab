"""float16 / bfloat16 conversion that keeps numerically sensitive ops in float32.

Rule: every node computes in the low-precision type except those in ``KEEP_FLOAT32`` (exponentials,
powers, normalisations and reductions, whose range or accumulated rounding overflow or lose
accuracy in 16 bits) and nodes with a subgraph. Float32 constants (initializers and Constant
nodes) are stored converted for their low-precision readers, with a converted copy when float32
nodes read them too; where a computed float value crosses from one precision to the other a
``Cast`` is inserted once per value. The graph's inputs and outputs keep their float32 type, so
callers see the same interface. Ops whose schema (at the model's opset) does not accept the type stay float32 too.
Inputs that the ONNX spec requires to be float32 whatever the data type (Resize's
``roi``/``scales``) are never converted.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize._graph import copy_model, remove_unused_initializers, with_types
from modelpress.passes._util import add_initializer, const_array

KEEP_FLOAT32 = {
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "BatchNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceL1",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
    "Exp",
    "Pow",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Erf",
    "CumSum",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
}
# (op, input index) that must stay float32 whatever the computation type.
FLOAT32_INPUTS = {("Resize", 1), ("Resize", 2), ("Upsample", 1)}

TYPES = {"fp16": (ir.DataType.FLOAT16, np.float16), "bf16": (ir.DataType.BFLOAT16, None)}


def _schema_allows(node: ir.Node, opset: int, type_name: str) -> bool:
    """Whether the op's schema at ``opset`` accepts ``type_name`` wherever it accepts float32
    (Conv, for one, accepts bfloat16 only from opset 22)."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return False
    for c in schema.type_constraints:
        allowed = set(c.allowed_type_strs)
        if "tensor(float)" in allowed and f"tensor({type_name})" not in allowed:
            return False
    return True


def _low(node: ir.Node, keep: set[str], opset: int, type_name: str) -> bool:
    if (
        node.domain not in ("", "ai.onnx")
        or node.op_type in keep
        or node.op_type in ("Cast", "CastLike", "Constant")
    ):
        return False
    if any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        return False
    return _schema_allows(node, opset, type_name)


def _convert_array(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return arr.astype(np.float16)
    import ml_dtypes

    return arr.astype(ml_dtypes.bfloat16)


def apply(
    model: ir.Model,
    *,
    dtype: str = "fp16",
    keep: set[str] | None = None,
    keep_nodes: frozenset[str] = frozenset(),
) -> tuple[ir.Model, list[str]]:
    """A converted copy of ``model`` and the names of the nodes left in float32.

    ``keep`` adds op types, ``keep_nodes`` node names, to what stays float32.
    """
    low_type, _ = TYPES[dtype]
    keep = KEEP_FLOAT32 | set(keep or ())
    m = with_types(copy_model(model))  # a copy with every value's type known
    g = m.graph
    nodes = list(g)
    opset = m.opset_imports.get("", 1)
    type_name = "float16" if dtype == "fp16" else "bfloat16"
    low_nodes = {
        id(n) for n in nodes if n.name not in keep_nodes and _low(n, keep, opset, type_name)
    }
    kept = [
        n.name for n in nodes if id(n) not in low_nodes and n.op_type not in ("Cast", "Constant")
    ]

    def wants_low(use) -> bool:
        return id(use.node) in low_nodes and (use.node.op_type, use.idx) not in FLOAT32_INPUTS

    # 1. constants read only by low-precision consumers become low precision in place
    for name, v in list(g.initializers.items()):
        if (
            v.dtype != ir.DataType.FLOAT
            or v.is_graph_input()
            or v.is_graph_output()
            or not v.uses()
        ):
            continue
        if all(wants_low(u) for u in v.uses()):
            arr = _convert_array(v.const_value.numpy(), dtype)
            v.const_value = ir.tensor(arr, name=name)
            v.type = ir.TensorType(low_type)
    # 2. outputs of low-precision nodes become low precision
    for n in nodes:
        if id(n) in low_nodes:
            for o in n.outputs:
                if o.dtype == ir.DataType.FLOAT:
                    o.type = ir.TensorType(low_type)
    # 3. Casts where a value meets a consumer of the other precision (and at graph outputs)
    values = (
        [v for v in g.inputs]
        + [o for n in nodes for o in n.outputs]
        + list(g.initializers.values())
    )
    for v in values:
        if v.dtype not in (ir.DataType.FLOAT, low_type):
            continue
        is_low = v.dtype == low_type
        mismatched = [u for u in v.uses() if wants_low(u) != is_low and _float_input(u)]
        if mismatched and not is_low and (arr := const_array(v)) is not None:
            # a constant is converted now, not at every run: a converted copy for the
            # low-precision readers
            low = add_initializer(g, _convert_array(arr, dtype), f"{v.name}_{dtype}")
            for u in mismatched:
                u.node.replace_input_with(u.idx, low)
        elif mismatched:
            target = ir.DataType.FLOAT if is_low else low_type
            cast = ir.node(
                "Cast",
                [v],
                attributes={"to": target},
                name=f"{v.name}_to_{'fp32' if is_low else dtype}",
            )
            cast.outputs[0].name = f"{v.name}_{'fp32' if is_low else dtype}"
            cast.outputs[0].type = ir.TensorType(target)
            cast.outputs[0].shape = v.shape
            producer = v.producer()
            if producer is not None:
                g.insert_after(producer, cast)
            else:
                g.insert_before(next(iter(g)), cast)
            for u in mismatched:
                u.node.replace_input_with(u.idx, cast.outputs[0])
        if is_low and v.is_graph_output():
            _restore_output(g, v)
    for n in [n for n in g if n.op_type == "Constant" and not any(o.uses() for o in n.outputs)]:
        if not any(o.is_graph_output() for o in n.outputs):
            g.remove(n, safe=True)
    remove_unused_initializers(g)
    g.sort()
    return m, kept


def _float_input(use) -> bool:
    # A Cast reads any type; a float value read by a node that converts it itself needs no Cast.
    return use.node.op_type not in ("Cast", "Shape", "Size")


def _restore_output(g: ir.Graph, v: ir.Value) -> None:
    """Keep a graph output float32: the low-precision value is renamed and cast back."""
    name = v.name
    cast = ir.node("Cast", [v], attributes={"to": ir.DataType.FLOAT}, name=f"{name}_output_cast")
    v.name = f"{name}_lowp"
    out = cast.outputs[0]
    out.name = name
    out.type = ir.TensorType(ir.DataType.FLOAT)
    out.shape = v.shape
    g.insert_after(v.producer(), cast)
    for i, o in enumerate(g.outputs):
        if o is v:
            g.outputs[i] = out
