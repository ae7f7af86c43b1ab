"""Rules for the layers whose weights own units: Conv, ConvTranspose, Gemm, MatMul (and MatMul
between two activations, attention's). A weight's output axis makes units; its input axis follows
the units of the value it reads; a bias-like constant moves with them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from modelpress.compress.prune.depgraph import param
from modelpress.compress.prune.registry import Refuse, rule
from modelpress.ir.match import attr

if TYPE_CHECKING:
    from modelpress.compress.prune.analyzer import Analyzer


def _bias(a: Analyzer, node: ir.Node, index: int, y: ir.Value, n: int) -> None:
    """A bias-like constant input broadcast against ``y``'s last axis of length ``n``."""
    if index >= len(node.inputs) or node.inputs[index] is None:
        return
    c = param(node.inputs[index])
    if c is None:
        raise Refuse
    if c.size <= 1 or c.shape[-1] == 1:
        return
    if c.shape[-1] != n:
        raise Refuse
    a.slice(node, index, c.ndim - 1, y, "bias")


# sources -------------------------------------------------------------------------------------
@rule("Conv")
def _conv(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = param(w)
    tx = a.track(x)
    if weights is None or weights.ndim < 3:
        raise Refuse
    group = int(attr(node, "group", 1))
    cout, cig = weights.shape[0], weights.shape[1]
    cin = cig * group
    if tx is not None and tx.axis != 1:
        raise Refuse
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    if group > 1 and group == cin:
        # depthwise (channel multiplier cout / cin): output channels follow their input channel
        if tx is None:
            return
        a.new(y, 1, tx.units, kind=a.g.kinds.get(x.name))
        a.link(x, y)
        a.slice(node, 1, 0, y, "weight")
        if has_bias:
            a.slice(node, 2, 0, y, "bias")
        a.edit(node, "group", x)
        return
    if tx is not None:
        if group == 1:
            a.slice(node, 1, 1, x, "weight")
        else:
            # grouped: every group reads its own channels through the same weight columns, so
            # local input channel j goes from every group at once
            if tx.block != 1:
                raise Refuse
            for u in range(tx.units):
                a.g.uf.union((x.name, u), (x.name, u % cig))
            a.slice(node, 1, 1, x, "weight", modulus=cig)
    a.new(y, 1, cout, source=node, kind="channels")
    a.slice(node, 1, 0, y, "weight")
    if has_bias:
        a.slice(node, 2, 0, y, "bias")
    if group > 1:
        cog = cout // group
        for o in range(cout):
            a.g.uf.union((y.name, o), (y.name, o % cog))


@rule("ConvTranspose")
def _conv_transpose(a: Analyzer, node: ir.Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    weights = param(node.inputs[1])
    if weights is None or int(attr(node, "group", 1)) != 1:
        raise Refuse
    tx = a.track(x)
    if tx is not None:
        if tx.axis != 1:
            raise Refuse
        a.slice(node, 1, 0, x, "weight")
    a.new(y, 1, weights.shape[1], source=node, kind="channels")
    a.slice(node, 1, 1, y, "weight")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        a.slice(node, 2, 0, y, "bias")


@rule("Gemm")
def _gemm(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = param(w)
    tx = a.track(x)
    if weights is None or weights.ndim != 2 or param(x) is not None:
        raise Refuse
    trans_a, trans_b = int(attr(node, "transA", 0)), int(attr(node, "transB", 0))
    if tx is not None:
        if tx.axis != (0 if trans_a else 1):
            raise Refuse
        a.slice(node, 1, 1 if trans_b else 0, x, "weight")
    n = weights.shape[0 if trans_b else 1]
    a.new(y, 1, n, source=node, kind="neurons")
    a.slice(node, 1, 0 if trans_b else 1, y, "weight")
    _bias(a, node, 2, y, n)


@rule("MatMul")
def _matmul(a: Analyzer, node: ir.Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    wx, ww = param(x), param(w)
    if wx is not None:
        raise Refuse  # a constant left operand: rare, not followed
    if ww is None:
        _matmul_activations(a, node)
        return
    tx = a.track(x)
    sx, sy = a.shape(x), a.shape(y)
    if ww.ndim != 2 or len(sx) < 2:
        raise Refuse
    if tx is not None:
        if tx.axis == len(sx) - 1:
            a.slice(node, 1, 0, x, "weight")
        else:  # rows (tokens, batch): they pass through; the features are then not a source
            a.new(y, tx.axis + len(sy) - len(sx), tx.units, kind=a.g.kinds.get(x.name))
            a.link(x, y)
            return
    a.new(y, len(sy) - 1, ww.shape[1], source=node, kind="neurons")
    a.slice(node, 1, 1, y, "weight")


def _matmul_activations(a: Analyzer, node: ir.Node) -> None:
    """A product of two computed tensors (attention: Q·Kᵀ, P·V). Contracted units are joined;
    batch axes (the heads) are joined across both operands and carried to the output."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    sx, sw, sy = a.shape(x), a.shape(w), a.shape(y)
    rx, rw, r = len(sx), len(sw), len(sy)
    if rx < 2 or rw < 2:
        raise Refuse
    tx, tw = a.track(x), a.track(w)
    out = None  # (axis, units, [values to link])
    if tx is not None and tx.axis == rx - 1:
        if tw is None or tw.axis != rw - 2:
            raise Refuse
        a.link(x, w)
        tx = None
        if tw is not None:
            tw = None
    elif tw is not None and tw.axis == rw - 2:
        raise Refuse
    for t, v, rank, other, other_shape, other_rank in (
        (tx, x, rx, w, sw, rw),
        (tw, w, rw, x, sx, rx),
    ):
        if t is None:
            continue
        oa = t.axis + r - rank
        if t.axis < rank - 2:  # a batch axis: the other operand must agree or broadcast
            k = oa - (r - other_rank)
            to = a.track(other)
            if 0 <= k < other_rank - 2:
                if to is not None and to.axis == k:
                    a.link(v, other)
                elif other_shape[k] != 1:
                    raise Refuse
            a.g.kinds[v.name] = "heads"
        if out is None:
            out = (oa, t.units, [v])
        elif out[0] == oa:
            out[2].append(v)
        else:
            raise Refuse
    if out is not None:
        a.new(
            y,
            out[0],
            out[1],
            kind="heads" if any(a.g.kinds.get(v.name) == "heads" for v in out[2]) else None,
        )
        for v in out[2]:
            a.link(v, y)
