"""float16 / bfloat16 conversion that keeps numerically sensitive ops in float32.

Rule: every node computes in the low-precision type except those in ``KEEP_FLOAT32`` (exponentials,
powers, normalisations and reductions, whose range or accumulated rounding overflow or lose
accuracy in 16 bits) and nodes with a subgraph. Float32 constants (initializers and Constant
nodes) are stored converted for their low-precision readers, with a converted copy when float32
nodes read them too; where a computed float value crosses from one precision to the other a
``Cast`` is inserted once per value. The graph's inputs and outputs keep their float32 type, so
callers see the same interface. Ops whose schema (at the model's opset) does not accept the type
stay float32 too, and so do ops whose float output takes its type from an attribute rather than an
input (EyeLike's ``dtype``), except ConstantOfShape, whose ``value`` is converted with it.
Elementwise float arithmetic whose results only become integers (index computations) stays
float32: 16-bit rounding would change the indices. Converted constants are clamped to the low
type's finite range.
Inputs that the ONNX spec requires to be float32 whatever the data type (Resize's
``roi``/``scales``) are never converted.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.modes import Built, Mode, Options, Prepared, register
from modelpress.ir.graph import add_initializer, copy_model, remove_unused_initializers
from modelpress.ir.match import const_array
from modelpress.ir.opset import newest_opset, op_schema
from modelpress.ir.shapes import with_types

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

# Elementwise arithmetic that index computations (T5's relative-position buckets) are made of.
INDEX_MATH = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "Neg",
    "Abs",
    "Min",
    "Max",
    "Floor",
    "Ceil",
    "Round",
    "Clip",
    "Sign",
    "Where",
    "Log",
    "Exp",
    "Pow",
    "Sqrt",
    "Reciprocal",
}
INDEX_TYPES = {
    ir.DataType.INT8,
    ir.DataType.INT16,
    ir.DataType.INT32,
    ir.DataType.INT64,
    ir.DataType.UINT8,
    ir.DataType.UINT16,
    ir.DataType.UINT32,
    ir.DataType.UINT64,
    ir.DataType.BOOL,
}

TYPES = {"fp16": (ir.DataType.FLOAT16, np.float16), "bf16": (ir.DataType.BFLOAT16, None)}
TYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


def _schema_allows(node: ir.Node, opset: int, type_name: str) -> bool:
    """Whether the op's schema at ``opset`` accepts ``type_name`` wherever it accepts float32
    (Conv, for one, accepts bfloat16 only from opset 22), and its float outputs take their type
    from an input: one typed by an attribute (EyeLike's ``dtype``, a window's
    ``output_datatype``) or fixed would stay float32 while the graph declares the low type.
    ConstantOfShape is the exception: ``apply`` converts its ``value``."""
    schema = op_schema(node.op_type, opset, node.domain)
    if schema is None:
        return False
    allowed = schema.allowed
    # inputs and outputs typed literally, not by a type parameter (NonMaxSuppression's boxes)
    literal = [t for t in schema.input_types + schema.output_types if t not in allowed]
    if "tensor(float)" in literal:
        return False
    # sequences and optionals hold their element type inside: converting around them would
    # leave the container's declared type behind (an op that only makes containers, or one
    # whose values here are containers)
    containers = ("seq(", "optional(")
    for t in schema.output_types:
        if all(k.startswith(containers) for k in allowed.get(t, {t})):
            return False
    values = [v for v in (*node.inputs, *node.outputs) if v is not None and v.type is not None]
    if any(not isinstance(v.type, ir.TensorType) for v in values):
        return False
    if any(
        "tensor(float)" in types and f"tensor({type_name})" not in types
        for types in allowed.values()
    ):
        return False
    inherited = set(schema.input_types) & allowed.keys()
    return node.op_type == "ConstantOfShape" or all(
        t in inherited or "tensor(float)" not in allowed.get(t, {t}) for t in schema.output_types
    )


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


def _index_math(nodes: list[ir.Node]) -> set[int]:
    """Ids of the elementwise float nodes whose results only become integers (a Cast to an
    integer or bool type, possibly through other such nodes): in 16 bits their rounding moves an
    index (T5's relative-position bucket 10 becomes 9) and a Gather reads a wrong row.

    Consumers come before producers (reverse topological order), and the walk stops at any other
    op, so a network whose output is rounded to integers (an image) still converts.
    """
    found: set[int] = set()
    for n in reversed(nodes):
        floats = [o for o in n.outputs if o.dtype == ir.DataType.FLOAT]
        if (
            n.domain in ("", "ai.onnx")
            and n.op_type in INDEX_MATH
            and floats
            and all(
                o.uses()
                and not o.is_graph_output()
                and all(id(u.node) in found or _to_index(u.node) for u in o.uses())
                for o in floats
            )
        ):
            found.add(id(n))
    return found


def _to_index(node: ir.Node) -> bool:
    return (
        node.op_type == "Cast"
        and node.domain in ("", "ai.onnx")
        and node.attributes.get_int("to") in INDEX_TYPES
    )


def _convert_array(arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` in the low type, finite values clamped to its range: float32's extremes (the
    ``finfo(float32).min`` of attention masks) would become infinities, and ``0 * -inf`` a NaN.
    Infinities and NaNs stay as they are."""
    import ml_dtypes

    low = np.float16 if dtype == "fp16" else ml_dtypes.bfloat16
    top = float(ml_dtypes.finfo(low).max)
    return np.where(np.isfinite(arr), np.clip(arr, -top, top), arr).astype(low)


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
    type_name = TYPE_NAMES[dtype]
    index_math = _index_math(nodes)
    low_nodes = {
        id(n)
        for n in nodes
        if n.name not in keep_nodes and id(n) not in index_math and _low(n, keep, opset, type_name)
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
                    if n.op_type == "ConstantOfShape":
                        _convert_fill(n, dtype)
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


def schema_note(model: ir.Model, dtype: str) -> str | None:
    """A note for the caller when the model's opset keeps float32 at least half of the nodes that
    could compute in the low type (most schemas accept bfloat16 only from opset 13, Conv's from
    22): the conversion then changes little, silently, and only an opset upgrade helps. None
    otherwise, a few blocked ops being no news worth a note."""
    type_name = TYPE_NAMES[dtype]
    opset = model.opset_imports.get("", 1)
    newest = newest_opset()
    convertible = [n for n in model.graph if _low(n, KEEP_FLOAT32, newest, type_name)]
    blocked = [n for n in convertible if not _schema_allows(n, opset, type_name)]
    if not blocked or 2 * len(blocked) < len(convertible):
        return None
    needs = {  # the first opset that accepts the type, for each blocked op
        op: next(v for v in range(opset + 1, newest + 1) if _schema_allows(n, v, type_name))
        for op, n in {n.op_type: n for n in blocked}.items()
    }
    op = max(needs, key=needs.get)
    return (
        f"{type_name}: {len(blocked)} of {len(convertible)} convertible nodes stay float32 "
        f"because their ops accept {type_name} only from a newer opset (model opset {opset}; "
        f"{op} needs {needs[op]}): upgrade with `modelpress optimize --opset {needs[op]}` first"
    )


def _convert_fill(node: ir.Node, dtype: str) -> None:
    """ConstantOfShape's output has the type of its ``value`` (a float32 zero when absent): the
    value is stored converted, so the node fills in the low type itself."""
    attr = node.attributes.get("value")
    arr = attr.value.numpy() if attr is not None else np.zeros(1, np.float32)
    node.attributes["value"] = ir.AttrTensor("value", ir.tensor(_convert_array(arr, dtype)))


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


class _HalfMode(Mode):
    dtype = ""

    def prepare(self, model, cal, opt: Options, progress) -> Prepared:
        names = [n.name for n in model.graph if n.op_type not in KEEP_FLOAT32]

        def build(exclude):
            q, kept = apply(model, dtype=self.dtype, keep_nodes=exclude)
            done = [n for n in names if n not in set(kept)]
            return Built.at_outputs(model, q, done)

        note = schema_note(model, self.dtype)
        return Prepared(build, names, [note] if note else [])


@register
class Float16Mode(_HalfMode):
    name = dtype = "fp16"
    order = 3
    help = "float16 weights and activations (GPUs)"


@register
class BFloat16Mode(_HalfMode):
    name = dtype = "bf16"
    order = 4
    help = "bfloat16 weights and activations (GPUs, recent CPUs)"
