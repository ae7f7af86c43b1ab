"""The QDQ builder: a plan and its quantization parameters become a standard ONNX graph.

Activations pass through ``QuantizeLinear → DequantizeLinear`` pairs (``insert_qdq``), weights
through ``DequantizeLinear`` of integer constants (``quantize_weight_input``, with an int32 bias at
``scale_x · scale_w``), so that ONNX Runtime's QDQ fusion turns each group into one integer kernel.
Public: QAT and the other modes build their graphs with it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import pairs
from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    constant,
    output_channel_axis,
    scalar_or_vector,
)
from modelpress.compress.quantize.ops import HARD_OPS, SHAPE_ONLY_OPS, passthrough
from modelpress.compress.quantize.plan import StaticPlan
from modelpress.compress.quantize.qparams import (
    QParams,
)
from modelpress.ir.graph import (
    bulk_names,
    copy_model,
    remove_unused_initializers,
    reserve,
    swap_node,
    taken_names,
)
from modelpress.ir.match import const_array, values_by_name


def _resolve_concat(p: StaticPlan, qp: dict[str, QParams], model: ir.Model) -> None:
    """A Concat input read by nothing else takes the Concat's scale (ONNX Runtime's QLinearConcat
    then copies bytes). Not when the input carries a folded Relu and the Concat's range goes below
    zero (the fold needs its own range to start at 0), nor when a scale-sharing op writes it."""
    vals = values_by_name(model.graph)
    folded = set(p.folds.values())
    for out, ins in p.concat_groups:
        if out not in qp:
            continue
        for carrier, read in ins:
            v = vals.get(read)
            if carrier not in qp or v is None or len(v.uses()) != 1 or v.is_graph_output():
                continue
            producer = v.producer()
            relu_fold = producer is not None and producer.name in folded
            if relu_fold and float(np.min(qp[out].range[0])) != 0.0:
                continue
            if producer is not None and passthrough(producer):
                continue  # it shares its own input's scale (QLinearConcat requantizes it)
            qp[carrier] = qp[out]


def insert_qdq(
    graph: ir.Graph, value: ir.Value, qp: QParams, *, output_too: bool = False
) -> ir.Value:
    """``value → Q → DQ``; every consumer of ``value`` now reads the DQ, and so does the graph
    output ``value`` is, when ``output_too`` (which keeps the output's name)."""
    scale = constant(graph, scalar_or_vector(qp.scale), f"{value.name}_scale")
    zp = constant(graph, scalar_or_vector(qp.zero_point), f"{value.name}_zero_point")
    q = ir.node("QuantizeLinear", [value, scale, zp], name=f"{value.name}_Q")
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=f"{value.name}_DQ")
    q.outputs[0].name = f"{value.name}_quantized"
    q.outputs[0].type = ir.TensorType(ir.DataType.from_numpy(qp.zero_point.dtype))
    q.outputs[0].shape = value.shape
    dq.outputs[0].name = f"{value.name}_dequantized"
    dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    dq.outputs[0].shape = value.shape
    reserve(graph, q.name, dq.name, q.outputs[0].name, dq.outputs[0].name, f"{value.name}_float")
    uses = list(value.uses())
    producer = value.producer()
    if producer is not None:
        graph.insert_after(producer, [q, dq])
    else:
        graph.insert_before(next(iter(graph)), [q, dq])
    for use in uses:
        if use.node is q:
            continue
        # an op that reads only the shape reads the 8-bit tensor: ONNX Runtime gives every reader
        # of a DequantizeLinear its own copy, and would dequantize a whole feature map for it
        reads = q.outputs[0] if use.node.op_type in SHAPE_ONLY_OPS else dq.outputs[0]
        use.node.replace_input_with(use.idx, reads)
    if output_too and value.is_graph_output() and producer is not None:
        name = value.name
        value.name = f"{name}_float"
        dq.outputs[0].name = name
        graph.outputs[:] = [dq.outputs[0] if v is value else v for v in graph.outputs]
    return dq.outputs[0]


def dq_constant(graph: ir.Graph, q: np.ndarray, qp: QParams, hint: str) -> ir.Value:
    """``DequantizeLinear`` of the integer constant ``q``. Names derive from ``hint`` and are
    unique: an initializer several nodes share (exporters deduplicate equal tensors, such as
    zero biases) gets one DQ per reader, each with its own scale."""
    taken = taken_names(graph)
    base, k = hint, 0
    while any(
        f"{hint}_{s}" in taken for s in ("quantized", "scale", "zero_point", "DQ", "dequantized")
    ):
        k += 1
        hint = f"{base}_{k}"
    qv = constant(graph, q, f"{hint}_quantized")
    scale = constant(graph, scalar_or_vector(qp.scale), f"{hint}_scale")
    zp = constant(graph, scalar_or_vector(qp.zero_point), f"{hint}_zero_point")
    attrs = {} if qp.axis is None or qp.scale.size == 1 else {"axis": qp.axis}
    if qp.block_size:
        attrs["block_size"] = qp.block_size
    dq = ir.node("DequantizeLinear", [qv, scale, zp], attributes=attrs, name=f"{hint}_DQ")
    dq.outputs[0].name = f"{hint}_dequantized"
    reserve(graph, f"{hint}_DQ", f"{hint}_dequantized")
    dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    dq.outputs[0].shape = ir.Shape(q.shape)
    graph.insert_before(next(iter(graph)), dq)
    return dq.outputs[0]


def quantize_weight_input(
    graph: ir.Graph,
    node: ir.Node,
    *,
    per_channel: bool,
    dtype: str = "int8",
    input_scale: float | None = None,
    bias_delta: np.ndarray | None = None,
    rounded: tuple[np.ndarray, QParams] | None = None,
    pair_safe: bool = False,
) -> tuple[QParams, np.ndarray]:
    """Replace the node's weight (and, given the input scale, its bias) by DQ of integer constants.

    Returns the weight's qparams and the dequantized weight. ``bias_delta`` is subtracted from the
    bias first (bias correction). ``rounded``: the weight's codes and QParams, chosen ahead (GPTQ);
    otherwise it is rounded to nearest. ``pair_safe``: int8 codes that CPUs without VNNI sum
    exactly (``pairs``).
    """
    idx = WEIGHT_INPUT[node.op_type]
    w = const_array(node.inputs[idx])
    if rounded is not None:
        wq, wqp = rounded
        if pair_safe and dtype == "int8":
            wq = pairs.limit(node, wq)
    else:
        wq, wqp = pairs.round_weight(
            node, w, per_channel=per_channel, dtype=dtype, pair_safe=pair_safe
        )
    base = node.inputs[idx].name or f"{node.name}_W"
    node.replace_input_with(idx, dq_constant(graph, wq, wqp, base))
    b = _corrected_bias(graph, node, bias_delta, w)
    if b is not None:
        if input_scale is None:
            _float_bias(graph, node, b)
        else:
            bscale = (np.float64(input_scale) * np.broadcast_to(wqp.scale, b.shape)).astype(
                np.float32
            )
            bscale = np.maximum(bscale, np.float32(1e-12))
            bq = np.clip(np.rint(b / bscale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
            # per-tensor weights give the bias one scale too (no axis: DequantizeLinear-10 has none)
            one = wqp.scale.size == 1
            bqp = QParams(
                scale=bscale[:1].reshape(()) if one else bscale,
                zero_point=np.zeros(() if one else b.shape, np.int32),
                dtype="int32",
                axis=None if one else 0,
            )
            node.replace_input_with(
                2, dq_constant(graph, bq, bqp, node.inputs[2].name or f"{node.name}_B")
            )
    return wqp, (wq.astype(np.float32) - _bcast(wqp.zero_point, wqp, w.ndim)) * _bcast(
        wqp.scale, wqp, w.ndim
    )


def _corrected_bias(
    graph: ir.Graph, node: ir.Node, delta: np.ndarray | None, weight: np.ndarray
) -> np.ndarray | None:
    """The bias of a Conv/Gemm (float ``weight``) minus ``delta``, in float64; a zero bias is
    added for a delta to go into. None when it has none and needs none."""
    if node.op_type not in ("Conv", "Gemm"):
        return None
    if len(node.inputs) < 3 or node.inputs[2] is None:
        if delta is None:
            return None
        node.resize_inputs(3)  # Gemm's output channels: axis 0 with transB, else 1
        zeros = np.zeros(weight.shape[output_channel_axis(node)], np.float32)
        node.replace_input_with(2, constant(graph, zeros, f"{node.name}_B"))
    b = const_array(node.inputs[2]).astype(np.float64)
    return b - delta if delta is not None else b


def _float_bias(graph: ir.Graph, node: ir.Node, b: np.ndarray) -> None:
    node.replace_input_with(2, constant(graph, b.astype(np.float32), f"{node.name}_B_corrected"))


def _expand_hard(graph: ir.Graph, node: ir.Node) -> None:
    """HardSigmoid / HardSwish, whose input already passes through Q/DQ, rewritten as ops with
    int8 kernels. ``HardSigmoid(x) = clip(αx + β, 0, 1)``: the 8-bit ``x`` read through a second
    DequantizeLinear whose scale is multiplied by α, plus β, is an Add (QLinearAdd), and the clip
    is the saturation of the output's QuantizeLinear, whose range lies within [0, 1]. HardSwish is
    ``x · HardSigmoid(x)``: that Add, quantized on the exact [0, 1] grid, then a Mul (QLinearMul).
    ONNX Runtime has no int8 kernel for either op: left in float, each needs a dequantize, two
    float passes and a quantize."""
    dq = node.inputs[0].producer()
    assert dq is not None and dq.op_type == "DequantizeLinear", node.name
    alpha = node.attributes.get_float("alpha", 0.2 if node.op_type == "HardSigmoid" else 1 / 6)
    beta = node.attributes.get_float("beta", 0.5)
    x_scale = const_array(dq.inputs[1])
    scaled = constant(
        graph, (x_scale * np.float32(alpha)).astype(np.float32), f"{node.name}_alpha_scale"
    )
    dq_alpha = ir.node(
        "DequantizeLinear", [dq.inputs[0], scaled, dq.inputs[2]], name=f"{node.name}_alpha"
    )
    act = const_array(dq.inputs[2]).dtype  # uint8 or int8: ONNX Runtime fuses only one type
    # β as an 8-bit constant: one code of a scale |β| (its zero point gives the sign)
    code, zp, scale = (1, 0, beta) if beta > 0 else ((0, 1, -beta) if beta < 0 else (0, 0, 1.0))
    dq_beta = ir.node(
        "DequantizeLinear",
        [
            constant(graph, np.array(code, act), f"{node.name}_beta_quantized"),
            constant(graph, np.array(scale, np.float32), f"{node.name}_beta_scale"),
            constant(graph, np.array(zp, act), f"{node.name}_beta_zero_point"),
        ],
        name=f"{node.name}_beta",
    )
    add = ir.node("Add", [dq_alpha.outputs[0], dq_beta.outputs[0]], name=f"{node.name}_add")
    for n in (dq_alpha, dq_beta, add):
        n.outputs[0].name = f"{n.name}_output"
        n.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    add.outputs[0].shape = node.inputs[0].shape
    reserve(graph, *(n.name for n in (dq_alpha, dq_beta, add)))
    reserve(graph, f"{node.name}_mul", *(n.outputs[0].name for n in (dq_alpha, dq_beta, add)))
    if node.op_type == "HardSigmoid":
        swap_node(graph, node, [dq_alpha, dq_beta, add], add.outputs[0])
        if not dq.outputs[0].uses() and not dq.outputs[0].is_graph_output():
            graph.remove(dq, safe=True)  # the Add reads the 8-bit input through its own DQ
        return
    mul = ir.node("Mul", [node.inputs[0], add.outputs[0]], name=f"{node.name}_mul")
    swap_node(graph, node, [dq_alpha, dq_beta, add, mul], mul.outputs[0])
    lowest = np.iinfo(act).min  # [0, 1] on all 256 codes
    unit = QParams(
        scale=np.array(1 / 255, np.float32), zero_point=np.array(lowest, act), dtype=act.name
    )
    insert_qdq(graph, add.outputs[0], unit)


def _bcast(p: np.ndarray, qp: QParams, ndim: int) -> np.ndarray:
    if qp.axis is None or p.size == 1:
        return p.astype(np.float32)
    shape = [1] * ndim
    shape[qp.axis] = -1
    return p.astype(np.float32).reshape(shape)


def apply(
    model: ir.Model,
    p: StaticPlan,
    qparams: dict[str, QParams],
    *,
    per_channel: bool = True,
    weight_dtype: str = "int8",
    bias_deltas: dict[str, np.ndarray] | None = None,
    rounded: dict[str, tuple[np.ndarray, QParams]] | None = None,
    pair_safe: bool = False,
) -> ir.Model:
    """A quantized copy of ``model``: ``qparams`` maps each observed (float) tensor to its QParams;
    ``rounded`` gives the weight codes of some layers (by node name, ``gptq.round_layers``)."""
    m = copy_model(model)
    with bulk_names(m.graph):
        _apply(m, p, qparams, per_channel, weight_dtype, bias_deltas, rounded or {}, pair_safe)
    return m


def _apply(m, p, qparams, per_channel, weight_dtype, bias_deltas, rounded, pair_safe) -> None:
    g = m.graph
    by_name = {n.name: n for n in g}
    by_tensor = {
        name: qparams[stats] if stats in qparams else qparams[name]
        for name, stats in p.tensors.items()
    }
    _resolve_concat(p, by_tensor, m)
    for node_name, relu_name in p.folds.items():
        qp = by_tensor[by_name[node_name].outputs[0].name]
        # The fold is exact only when the lowest code is 0.0: then saturation clips like Relu.
        # plan() folds only for asymmetric activations, whose range then starts at 0.
        assert float(np.min(qp.range[0])) == 0.0, node_name
        relu = by_name[relu_name]
        y = by_name[node_name].outputs[0]
        for use in list(relu.outputs[0].uses()):
            use.node.replace_input_with(use.idx, y)
        g.remove(relu, safe=True)
    layer_inputs = {n: by_name[n].inputs[0].name for n in p.layers}
    vals = values_by_name(g)
    for name, qp in by_tensor.items():
        insert_qdq(g, vals[name], qp, output_too=name in p.requantized_outputs)
    for node_name in p.layers:
        node = by_name[node_name]
        if node.op_type in HARD_OPS:
            _expand_hard(g, node)
        if node.op_type not in WEIGHT_INPUT:
            continue
        x_qp = by_tensor.get(layer_inputs[node_name])
        scale = float(x_qp.scale) if x_qp is not None else None
        quantize_weight_input(
            g,
            node,
            per_channel=per_channel,
            dtype=weight_dtype,
            input_scale=scale,
            bias_delta=(bias_deltas or {}).get(node_name),
            rounded=rounded.get(node_name),
            pair_safe=pair_safe,
        )
    for node_name in p.float_heads:  # float weights; the measured shift still corrected
        delta = (bias_deltas or {}).get(node_name)
        node = by_name[node_name]
        w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
        if delta is not None and (b := _corrected_bias(g, node, delta, w)) is not None:
            _float_bias(g, node, b)
    remove_unused_initializers(g)
    g.sort()
