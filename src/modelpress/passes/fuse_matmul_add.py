"""MatMul with a 2-D weight followed by a constant bias Add → one Gemm, when the input is 2-D.

``Add(MatMul(x, W), b)`` = ``Gemm(x, W, b)`` when x is (N, K) and W is (K, M) (Gemm takes only
2-D A and B) and the constant ``b`` broadcasts along the last axis only: a scalar, (1,), (M,) or
(1, M). A ``Transpose(perm=[1, 0])`` feeding W is absorbed as ``transB=1`` (W then need not be a
constant, only known to be 2-D), which is how PyTorch lays out ``nn.Linear`` weights.

Precondition (``check``): x is known to have rank 2 and W rank 2 (from shape information or W's
constant value); the bias is a constant of a floating dtype whose shape leaves the product's shape
unchanged; and the MatMul output (and the Transpose output, when absorbed) has no other reader and
is no graph output. Otherwise the Add stays as it is.

Inputs of rank > 2 are left alone on purpose: the alternative, Reshape → Gemm → Reshape, adds a
node and is no faster under ONNX Runtime, which fuses MatMul + Add itself when it loads a
model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import insert_node, replace_with_new
from modelpress.ir.match import (
    attr,
    const_array,
    graph_opset,
    in_graph,
    is_single_use,
    known_rank,
    other_input,
    producer_of,
)
from modelpress.passes.rule import FusionPass, absorb_refusal

_GEMM_DTYPES = {"float16", "float32", "float64"}


def _rank(value: ir.Value) -> int | None:
    array = const_array(value)
    return array.ndim if array is not None else known_rank(value)


@dataclass
class _Match:
    add: ir.Node
    matmul: ir.Node
    bias: ir.Value | None
    # derived by the check
    weight: ir.Value | None = None
    transpose: ir.Node | None = None  # absorbed as transB=1


class FuseMatMulAdd(FusionPass[_Match]):
    """MatMul(x 2-D, W 2-D) + Add(constant bias on the last axis) → Gemm."""

    name = "fuse-matmul-add"
    ops = ("Add",)

    def check_graph(self, graph) -> str | None:
        if graph_opset(graph, self.model) < 7:
            return "opset < 7: Gemm's broadcast of C starts at opset 7"
        return None

    def matches(self, graph, add: ir.Node) -> Iterator[_Match]:
        for product in add.inputs:
            matmul = producer_of(product, "MatMul")
            if matmul is not None:
                yield _Match(add, matmul, other_input(add, product))

    def check(self, graph, m: _Match) -> str | None:
        product = m.matmul.outputs[0]
        reason = absorb_refusal(graph, m.matmul, product, "Gemm yields only product + bias")
        if reason is not None:
            return reason
        bias = const_array(m.bias)
        # Add requires equal operand types, so the bias's dtype is the product's dtype.
        if bias is None:
            return "the bias is not a constant"
        if bias.dtype.name not in _GEMM_DTYPES:
            return f"the bias is {bias.dtype.name}: Gemm takes float16, float32 or float64"
        x, w = m.matmul.inputs
        transpose = producer_of(w, "Transpose")
        if (
            transpose is not None
            and in_graph(transpose, graph)
            and list(attr(transpose, "perm", [1, 0])) == [1, 0]
            and is_single_use(w)
            and _rank(transpose.inputs[0]) == 2
        ):
            m.weight, m.transpose = transpose.inputs[0], transpose
        else:
            m.weight, m.transpose = w, None
        if _rank(x) != 2:
            return "the input is not known to be 2-D: Gemm takes a 2-D A"
        if _rank(m.weight) != 2:
            return "the weight is not known to be 2-D: Gemm takes a 2-D B"
        # The bias must broadcast along the last axis only, so the output shape stays (N, M).
        if bias.ndim > 2 or any(d != 1 for d in bias.shape[:-1]):
            return f"the bias, shaped {bias.shape}, does not broadcast along the last axis only"
        w_const = const_array(m.weight)
        trans_b = 1 if m.transpose is not None else 0
        columns = (w_const.shape if w_const is not None else m.weight.shape)[1 - trans_b]
        if bias.size != 1 and (not isinstance(columns, int) or bias.size != columns):
            return f"the bias has {bias.size} elements, the product {columns} columns"
        return None

    def rewrite(self, graph, m: _Match) -> int:
        out = m.add.outputs[0]
        attributes = {"transB": 1} if m.transpose is not None else {}
        # Before the Add, not the MatMul: a bias made by a Constant node may sit between them.
        gemm = insert_node(
            graph, m.add, "Gemm", [m.matmul.inputs[0], m.weight, m.bias], attributes, like=out
        )
        replace_with_new(out, gemm.outputs[0])
        graph.remove([m.add, m.matmul], safe=True)
        if m.transpose is not None:
            graph.remove(m.transpose, safe=True)
        return 1
