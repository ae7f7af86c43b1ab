"""The static plan: which nodes are quantized, which tensors are wrapped in Q/DQ and whose
range sets each scale, which Relus fold, which Concats share a scale; decided on the float model.

Graph outputs stay float: the last quantized op dequantizes into them (a Conv through its own Q/DQ,
since ONNX Runtime has no int8 Conv with a float output); a MatMul/Gemm that no quantized op reads
keeps a float output (the runtime's integer-to-float kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    is_float,
)
from modelpress.compress.quantize.ops import BINARY_OPS, HARD_OPS, passthrough, relu_after, through
from modelpress.compress.quantize.selection import concats_in_chain, select_layers


@dataclass
class StaticPlan:
    """What to quantize, decided on the float model (node names are stable across copies)."""

    layers: list[str] = field(default_factory=list)  # quantized compute nodes, in graph order
    folds: dict[str, str] = field(default_factory=dict)  # compute node → Relu/Clip node it absorbs
    # tensor to wrap in Q/DQ (name after folding) → tensor of the float model whose range sets it
    tensors: dict[str, str] = field(default_factory=dict)
    # Concat output → its inputs, as (tensor carrying it after folding, tensor the Concat reads)
    concat_groups: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    # graph outputs written by a Conv: the output itself becomes the DQ (ONNX Runtime has no int8
    # Conv with a float output); every other graph output stays the float value
    requantized_outputs: set[str] = field(default_factory=set)
    # classifier heads kept float (``head_candidates``); bias correction still reaches them
    float_heads: list[str] = field(default_factory=list)

    @property
    def observed(self) -> list[str]:
        return sorted(set(self.tensors.values()))


def plan(
    model: ir.Model,
    *,
    exclude: frozenset[str] = frozenset(),
    asymmetric: bool = True,
    activations: str = "uint8",
    min_reduction: int = 16,
    heads: frozenset[str] = frozenset(),
) -> StaticPlan:
    """``asymmetric``: activations' zero points sit at their range's lowest code, so that a range
    starting at 0 saturates like a Relu (folded into the op before it) and like HardSigmoid's lower
    clip (``_expand_hard``). With symmetric activations neither holds: Relus stay, and so do
    HardSigmoid and HardSwish, in float. So they do with int8 ``activations``: ONNX Runtime (x86)
    then fuses neither the Add nor the Mul they are written as, which would only add work.

    ``heads`` (of ``head_candidates``) stay float, and the op computing their input too."""
    p = StaticPlan()
    alias: dict[str, str] = {}  # float tensor name → tensor that carries it after folding
    if not asymmetric or activations != "uint8":
        exclude = exclude | {n.name for n in model.graph if n.op_type in HARD_OPS}
    # A float head's input is computed in float too (a global pool, through Flatten, runs on the
    # dequantized map); the ops before it stay in the chain.
    heads = frozenset(heads - exclude)
    p.float_heads = [n.name for n in model.graph if n.name in heads]
    pools = {through(v, False)[0] for n in model.graph if n.name in heads for v in n.inputs[:1]}
    pools = frozenset(n.name for n in pools if n is not None and n.op_type not in WEIGHT_INPUT)
    selected = select_layers(
        model,
        exclude=exclude | heads | pools,
        min_reduction=min_reduction,
        float_readers=pools,
    )
    names = {n.name for n in selected}
    for node in selected:
        p.layers.append(node.name)
        n_act = 2 if node.op_type in BINARY_OPS else 1
        for v in node.inputs[:n_act]:
            p.tensors.setdefault(alias.get(v.name, v.name), v.name)
        y = node.outputs[0]
        if not is_float(y):
            continue
        if y.is_graph_output():
            # ONNX Runtime has no int8 Conv with a float output: without Q/DQ it would run the
            # float kernel on weights dequantized at every run. MatMul/Gemm write float directly.
            if node.op_type == "Conv":
                p.tensors[y.name] = y.name
                p.requantized_outputs.add(y.name)
            continue
        consumers = through(y, True)
        # A consumer kept in float on purpose (user or accuracy budget) must see the float output,
        # unless a Conv writes it: ONNX Runtime would then run the Conv in float on weights
        # dequantized at every run; the consumer reads the dequantized output instead.
        if node.op_type != "Conv" and any(c is not None and c.name in exclude for c in consumers):
            continue
        # A MatMul/Gemm read only by float ops keeps a float output (ONNX Runtime: QGemm /
        # MatMulIntegerToFloat): requantizing, e.g. a transformer's outlier-heavy projections
        # before the residual Add, would only add error and a conversion.
        if node.op_type in ("MatMul", "Gemm") and not any(
            c is not None and c.name in names for c in consumers
        ):
            continue
        relu = relu_after(node) if asymmetric else None
        if relu is not None:
            p.folds[node.name] = relu.name
            alias[relu.outputs[0].name] = y.name
            p.tensors[y.name] = relu.outputs[0].name
        else:
            p.tensors[y.name] = y.name
    # A Concat whose output reaches only quantized ops, through scale-sharing ops (ShuffleNet's
    # channel shuffle: Concat → Reshape → Transpose → Reshape → Slice → Conv), is quantized at
    # its own output, so that the shuffle runs on 8-bit data (QLinearConcat) instead of
    # dequantizing into it and quantizing after it.
    for node in concats_in_chain(model, names, exclude):
        p.tensors.setdefault(node.outputs[0].name, node.outputs[0].name)
    # Scale sharing, in graph order so that chains (MaxPool → Reshape → ...) propagate.
    for node in model.graph:
        if node.name in exclude:
            continue
        x = node.inputs[0] if node.inputs else None
        if x is None or not node.outputs:
            continue
        src = alias.get(x.name, x.name)
        y = node.outputs[0]
        if passthrough(node) and src in p.tensors and not y.is_graph_output() and is_float(y):
            p.tensors[y.name] = p.tensors[src]
            alias.setdefault(y.name, y.name)
        elif node.op_type == "Concat" and y.name in p.tensors:
            ins = [(alias.get(v.name, v.name), v.name) for v in node.inputs if v is not None]
            p.concat_groups.append((y.name, ins))
    return p
