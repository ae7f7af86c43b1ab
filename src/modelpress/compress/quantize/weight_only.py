"""Weight-only quantization: constant weights stored as integers, activations stay float.

Rule: the weight ``W`` of a MatMul/Gemm/Conv (and the table of a Gather, usually an embedding) is
replaced by ``DequantizeLinear(W_q, scale, zero_point)``; the op itself is untouched, so the model
computes with ``Ŵ`` in float and stays exactly as portable as before, only smaller.
- ``bits=8``: int8, symmetric, one scale per output channel (per row for Gather tables);
- ``bits=4``: int4, symmetric, one scale per block of ``block_size`` consecutive elements along the
  reduction axis (``DequantizeLinear``'s ``block_size``, opset 21; the model is upgraded to opset
  21 only when it is older, and the result says so). A weight whose reduction axis is not a multiple
  of the block size keeps int8 per-channel form.
ONNX Runtime fuses the 4-bit MatMul form into its ``MatMulNBits`` kernel.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize._graph import (
    const_array,
    copy_model,
    input_channel_axis,
    output_channel_axis,
    remove_unused_initializers,
    weight_nodes,
)
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerGroup,
    fake_quantize,
    quantize,
    weight_qparams,
)
from modelpress.compress.quantize.static import _dq_constant
from modelpress.errors import OptionError

BLOCKWISE_OPSET = 21


def _gather_tables(graph: ir.Graph) -> list[ir.Node]:
    out = []
    for node in graph:
        if (
            node.op_type == "Gather"
            and node.domain in ("", "ai.onnx")
            and node.attributes.get_int("axis", 0) == 0
        ):
            t = const_array(node.inputs[0])
            if t is not None and t.dtype == np.float32 and t.ndim == 2:
                out.append(node)
    return out


def layers(model: ir.Model) -> list[ir.Node]:
    """The nodes whose constant weight (or table) this mode quantizes."""
    return list(weight_nodes(model.graph)) + _gather_tables(model.graph)


def local_errors(
    model: ir.Model,
    nodes: list[ir.Node],
    inputs: dict[str, np.ndarray],
    *,
    bits: int,
    block_size: int,
) -> dict[str, float]:
    """How much each layer's own output changes when its weight is quantized: ``‖x(W − Ŵ)‖ / ‖xW‖``
    on the layer's real input for MatMul/Gemm, ``‖W − Ŵ‖ / ‖W‖`` for convolutions and tables. One
    forward pass ranks every layer (the accuracy budget's order)."""
    out = {}
    for node in nodes:
        is_table = node.op_type == "Gather"
        w = const_array(node.inputs[0 if is_table else 1])
        red = 1 if is_table else input_channel_axis(node)
        if bits == 4 and w.shape[red] % block_size == 0:
            qp = weight_qparams(w, PerGroup(red, block_size), dtype="int4", symmetric=True)
        else:
            qp = weight_qparams(
                w,
                PerChannel(0 if is_table else output_channel_axis(node)),
                dtype="int8",
                symmetric=True,
            )
        d = fake_quantize(w, qp) - w
        x = inputs.get(node.inputs[0].name)
        if node.op_type in ("MatMul", "Gemm") and x is not None:
            x2 = x.reshape(-1, x.shape[-1]).astype(np.float32)
            wk = w.T if node.op_type == "Gemm" and node.attributes.get_int("transB", 0) else w
            dk = d.T if node.op_type == "Gemm" and node.attributes.get_int("transB", 0) else d
            out[node.name] = float(np.linalg.norm(x2 @ dk) / max(np.linalg.norm(x2 @ wk), 1e-30))
        else:
            out[node.name] = float(np.linalg.norm(d) / max(np.linalg.norm(w), 1e-30))
    return out


def apply(
    model: ir.Model,
    *,
    bits: int = 8,
    block_size: int = 32,
    exclude: frozenset[str] = frozenset(),
    method: str = "minmax",
    tables_bits: int | None = None,
    int8_layers: frozenset[str] = frozenset(),
) -> tuple[ir.Model, list[str], list[str]]:
    """A weight-only quantized copy of ``model``, the nodes quantized, and notes for the user.

    ``tables_bits`` sets the bits of Gather tables separately (default: ``bits``); nodes named in
    ``int8_layers`` keep 8 bits when ``bits=4`` (the accuracy budget's fallback).
    """
    if bits not in (4, 8):
        raise OptionError(f"--bits {bits}: weight-only quantization supports 8 or 4 bits")
    if bits == 4 and (block_size < 16 or block_size & (block_size - 1)):
        raise OptionError(f"--block-size {block_size}: use a power of two of at least 16")
    notes: list[str] = []
    m = copy_model(model)
    if 4 in (bits, tables_bits) and m.opset_imports.get("", 0) < BLOCKWISE_OPSET:
        from modelpress.ir.opset import upgrade_opset

        notes.append(
            f"upgraded opset {m.opset_imports.get('', 0)} → {BLOCKWISE_OPSET} (4-bit blocks need DequantizeLinear-21)"
        )
        m = upgrade_opset(m, BLOCKWISE_OPSET)
    g = m.graph
    done = []
    fallback = 0
    targets = [
        (n, 1, output_channel_axis(n), input_channel_axis(n), 8 if n.name in int8_layers else bits)
        for n in weight_nodes(g)
    ]
    targets += [(n, 0, 0, 1, tables_bits or bits) for n in _gather_tables(g)]
    cache: dict[int, ir.Value] = {}  # a table shared by several nodes is quantized once
    for node, idx, out_axis, red_axis, nbits in targets:
        if node.name in exclude:
            continue
        v = node.inputs[idx]
        if id(v) in cache:
            node.replace_input_with(idx, cache[id(v)])
            done.append(node.name)
            continue
        w = const_array(v)
        if nbits == 4 and w.shape[red_axis] % block_size == 0:
            qp = weight_qparams(
                w, PerGroup(red_axis, block_size), dtype="int4", symmetric=True, method=method
            )
        else:
            fallback += nbits == 4
            qp = weight_qparams(
                w, PerChannel(out_axis), dtype="int8", symmetric=True, method=method
            )
        q = quantize(w, qp)
        if qp.dtype == "int4":
            import ml_dtypes

            q = q.astype(ml_dtypes.int4)
            zp = np.zeros(qp.zero_point.shape, ml_dtypes.int4)
            qp = type(qp)(
                scale=qp.scale,
                zero_point=zp,
                dtype=qp.dtype,
                axis=qp.axis,
                block_size=qp.block_size,
            )
        dq = _dq_constant(g, q, qp, v.name or f"{node.name}_W")
        cache[id(v)] = dq
        node.replace_input_with(idx, dq)
        done.append(node.name)
    if fallback:
        notes.append(
            f"{fallback} weight(s) kept int8 per-channel: reduction axis not a multiple of {block_size}"
        )
    remove_unused_initializers(g)
    g.sort()
    return m, done, notes
