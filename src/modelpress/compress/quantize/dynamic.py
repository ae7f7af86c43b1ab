"""Dynamic int8 quantization: weights quantized ahead of time, activations at run time.

Rule: every MatMul/Gemm with a constant 2-D weight becomes, in standard ONNX ops,
``DynamicQuantizeLinear(x) → MatMulInteger(x_q, W_q, x_zp, W_zp) → Cast → Mul(x_scale · W_scale)
[→ Add(bias)]``, with int8 symmetric weights (per output column when ``per_channel``) and uint8
activations whose scale is computed per batch. ONNX Runtime fuses exactly this chain into one
``DynamicQuantizeMatMul`` kernel (u8s8, VNNI on x86), so the output is standard ONNX and runs fast
there. Large embedding tables become int8 rows with one scale each, converted back only for the
rows a Gather looks up. Convolutions stay float: ``ConvInteger`` has no fast kernel in ONNX Runtime. Legal for any
graph: each rewritten node keeps its output value, so consumers are untouched.

With calibration data, activation outliers are first moved into the weights (``smoothing``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import pairs
from modelpress.compress.quantize.layers import constant, gather_tables, plain_linear, weight_nodes
from modelpress.compress.quantize.modes import Built, Mode, Options, Prepared, register
from modelpress.compress.quantize.qparams import PerChannel, PerTensor, quantize, weight_qparams
from modelpress.compress.quantize.smoothing import attention_like, calibrate, kn_weight, smooth
from modelpress.ir.graph import copy_model, remove_unused_initializers, swap_node
from modelpress.ir.match import const_array


def eligible(node: ir.Node) -> bool:
    if node.op_type == "Conv":
        return False
    return plain_linear(node)


def layers(model: ir.Model, exclude: frozenset[str] = frozenset()) -> list[ir.Node]:
    return [n for n in weight_nodes(model.graph) if eligible(n) and n.name not in exclude]


# Tables smaller than this stay float: the saving is not worth two extra nodes.
TABLE_MIN_SIZE = 1 << 16


def table_layers(g: ir.Graph) -> list[ir.Node]:
    """The Gathers whose table ``tables`` stores as int8 rows: layers of the error report, which
    the accuracy budget (or ``exclude``) can keep in float like any other."""
    return gather_tables(g, min_size=TABLE_MIN_SIZE)


def tables(g: ir.Graph, exclude: frozenset[str] = frozenset()) -> list[str]:
    """Store every large embedding table of ``g`` as int8 rows (``_quantize_table``), in place,
    and return the names of the Gathers rewritten; static int8 uses it too: a Gather has no int8
    kernel, but the table is most of a transformer's file."""
    cache: dict = {}
    done = []
    for node in table_layers(g):
        if node.name not in exclude:
            done.append(node.name)
            _quantize_table(g, node, cache)
    return done


def _quantize_table(g: ir.Graph, node: ir.Node, cache: dict) -> None:
    """``Gather(T, ids)`` → ``Cast(Gather(T_q, ids)) · Gather(S, ids)``: int8 rows, one scale per
    row (``S`` is ``[V, 1]`` so that the looked-up scales broadcast over the row without an
    Unsqueeze, whose form changed at opset 13), and only the rows looked up are converted."""
    table = node.inputs[0]
    if id(table) not in cache:
        t = const_array(table)
        qp = weight_qparams(t, PerChannel(0), dtype="int8", symmetric=True)
        cache[id(table)] = (
            constant(g, quantize(t, qp), f"{table.name}_quantized"),
            constant(g, qp.scale.reshape(-1, 1).astype(np.float32), f"{table.name}_row_scale"),
        )
    tq, scale = cache[id(table)]
    ids = node.inputs[1]
    base = node.name
    rows = ir.node("Gather", [tq, ids], attributes={"axis": 0}, name=f"{base}_rows")
    cast = ir.node(
        "Cast", [rows.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name=f"{base}_Cast"
    )
    sc = ir.node("Gather", [scale, ids], attributes={"axis": 0}, name=f"{base}_scales")
    out = ir.node("Mul", [cast.outputs[0], sc.outputs[0]], name=f"{base}_dequantize")
    for n in (rows, cast, sc):
        n.outputs[0].name = f"{n.name}_output"
    swap_node(g, node, [rows, cast, sc, out], out.outputs[0])


def apply(
    model: ir.Model,
    *,
    per_channel: bool = True,
    exclude: frozenset[str] = frozenset(),
    smoothing: dict[str, np.ndarray] | None = None,
    quantize_tables: bool = True,
    pair_safe: bool = False,
) -> tuple[ir.Model, list[str]]:
    """A dynamically quantized copy of ``model`` and the names of the nodes it quantized (lookup
    tables included).

    ``smoothing`` (from ``smoothing.calibrate``) maps activation inputs to per-channel factors;
    ``quantize_tables`` stores large Gather tables (embeddings) as int8 rows; ``pair_safe``
    keeps the weights' pair sums within what CPUs without VNNI add exactly (``pairs``).
    """
    m = smooth(model, smoothing) if smoothing else copy_model(model)
    g = m.graph
    done = []
    for node in layers(m, exclude):
        w = kn_weight(node)
        if pair_safe:  # MatMulInteger reduces over W's rows
            qp = pairs.rows_qparams(w.T, axis=1, per_channel=per_channel)
        else:
            qp = weight_qparams(
                w, PerChannel(1) if per_channel else PerTensor(), dtype="int8", symmetric=True
            )
        wq = quantize(w, qp)
        base = node.name
        dql = ir.node(
            "DynamicQuantizeLinear", [node.inputs[0]], num_outputs=3, name=f"{base}_DynamicQuantize"
        )
        xq, xs, xzp = dql.outputs
        for v, suffix in zip(dql.outputs, ("quantized", "scale", "zero_point"), strict=True):
            v.name = f"{base}_input_{suffix}"
        w_val = constant(g, wq, f"{base}_W_quantized")
        wzp = constant(
            g,
            np.zeros(qp.scale.shape, np.int8) if per_channel else np.int8(0),
            f"{base}_W_zero_point",
        )
        mmi = ir.node("MatMulInteger", [xq, w_val, xzp, wzp], name=f"{base}_MatMulInteger")
        cast = ir.node(
            "Cast", [mmi.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name=f"{base}_Cast"
        )
        ws = constant(g, qp.scale.astype(np.float32), f"{base}_W_scale")
        scale = ir.node("Mul", [xs, ws], name=f"{base}_scale")
        out = ir.node("Mul", [cast.outputs[0], scale.outputs[0]], name=f"{base}_rescale")
        new_nodes = [dql, mmi, cast, scale, out]
        result = out.outputs[0]
        if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
            add = ir.node("Add", [result, node.inputs[2]], name=f"{base}_bias")
            new_nodes.append(add)
            result = add.outputs[0]
        for v in new_nodes[1:]:
            v.outputs[0].name = v.outputs[0].name or f"{v.name}_output"
        swap_node(g, node, new_nodes, result)
        done.append(node.name)
    if quantize_tables:
        done += tables(g, exclude)
    remove_unused_initializers(g)
    g.sort()
    return m, done


@register
class DynamicMode(Mode):
    name = "dynamic"
    order = 1
    help = "int8 weights, activations quantized at run time (transformers)"
    nothing_to_quantize = (
        "it quantizes MatMul and Gemm with constant weights (transformers); for Conv layers use "
        "static mode"
    )

    def int8_layers(self, model, options: Options) -> bool:
        return bool(layers(model))

    def prepare(self, model, cal, opt: Options, progress) -> Prepared:
        nodes = layers(model)
        factors = None
        notes = []
        # (as in static mode: a CNN's classifier head has no outlier channels, and loses to it)
        if cal is not None and opt.smooth and attention_like(model):
            factors, n_inputs = calibrate(
                model, nodes, cal, per_channel=opt.per_channel, progress=progress
            )
            if n_inputs:
                notes.append(
                    f"activation outliers moved into weights (smoothing) for {len(factors)} of {n_inputs} input(s)"
                )

        def build(exclude):
            q, done = apply(
                model,
                per_channel=opt.per_channel,
                exclude=exclude,
                smoothing=factors,
                pair_safe=opt.pair_safe,
            )
            return Built.at_outputs(model, q, done)

        tables = [n.name for n in table_layers(model.graph)]
        return Prepared(build, [n.name for n in nodes] + tables, notes)
