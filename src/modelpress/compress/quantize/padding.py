"""Channel padding for ONNX Runtime's int8 depthwise kernel.

ONNX Runtime (x86) runs a depthwise int8 Conv with its fast symmetric kernel only when the channel
count is a multiple of 16 (``MlasConvSymPackWSize``); otherwise it falls back to a generic kernel
about twice as slow. Mobile CNNs are full of such counts (72, 120, 184, 200, 58, 116, ...), and
their depthwise Convs are a large share of the int8 run time.

``pad_depthwise`` gives such a Conv ``C' = ⌈C/16⌉·16`` channels, and with it every tensor that
carries the same channels. Each new channel is a copy of the last real one: the Convs that write
the channels and the depthwise Convs repeat their last filter and bias, per-channel ops on the way
(Relu, Sigmoid, squeeze-excite's pool and Mul, ...) their last constant, and the Convs that read
the channels get zero weights for the copies. The outputs are exact in float; in int8 every
tensor keeps its range (a copy adds no new value), so its scale does not move either.

Padded only where every reader and writer of those channels is one of these ops, on 2-D
convolutions: a region that reaches a Concat, a Reshape, a graph input or output, or a Conv whose
bias is not a constant, is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.layers import constant, is_channel_constant
from modelpress.ir.graph import bulk_names, copy_model, remove_unused_initializers
from modelpress.ir.match import const_array

ALIGN = 16  # channel multiple of ONNX Runtime's x86 int8 depthwise kernel
# The most extra channels accepted, as a share of the real ones: up to doubling (8 → 16). Measured
# on three inverted-residual blocks at 56x56 (int8 / float32 at batch 8, unpadded → padded):
# 8 channels 2.0 → 1.7, 12: 2.5 → 1.5, 20: 1.9 → 1.0, 24: 1.9 → 1.1, 40: 1.6 → 0.94, 72: 1.05 →
# 0.70. The generic kernel costs more than the Convs around it gain in work.
MAX_GROWTH = 1.0

# Ops applied per element (extra inputs, such as Clip's bounds, one value each).
ELEMENTWISE = {
    "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Softplus", "Mish", "Gelu", "Identity",
}  # fmt: skip
BINARY = {"Add", "Sub", "Mul"}
POOLS = {"GlobalAveragePool", "GlobalMaxPool", "MaxPool", "AveragePool"}


def _default(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _group(node: ir.Node) -> int:
    return node.attributes.get_int("group", 1)


def _weight(node: ir.Node) -> np.ndarray | None:
    """A 2-D Conv's constant float weight, if its bias (when it has one) is a constant too."""
    w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None or w.dtype != np.float32 or w.ndim != 4:
        return None
    if _bias(node) is None and len(node.inputs) > 2 and node.inputs[2] is not None:
        return None
    return w


def _bias(node: ir.Node) -> np.ndarray | None:
    return (
        const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    )


def _is_depthwise(node: ir.Node) -> bool:
    if node.op_type != "Conv" or not _default(node):
        return False
    w = _weight(node)
    return w is not None and _group(node) == w.shape[0] > 1 and w.shape[1] == 1


def _plain_conv(node: ir.Node) -> bool:
    return (
        node.op_type == "Conv"
        and _default(node)
        and _group(node) == 1
        and _weight(node) is not None
    )


class _Region:
    """The tensors that carry a depthwise Conv's channels, and the nodes around them."""

    def __init__(self, c: int):
        self.c = c
        self.values: set[ir.Value] = set()
        self.inner: set[ir.Node] = set()  # depthwise Convs and per-channel ops
        self.writers: set[ir.Node] = set()  # plain Convs whose output channels are padded
        self.readers: set[ir.Node] = set()  # plain Convs whose input channels are padded

    def grow(self, start: ir.Value) -> bool:
        """Collect the region from ``start``; False where it reaches an op it cannot pad."""
        todo = [start]
        while todo:
            v = todo.pop()
            if v in self.values:
                continue
            if v.is_graph_output() or v.is_graph_input():
                return False
            if v.shape is not None and (len(v.shape) != 4 or v.shape[1] != self.c):
                return False
            self.values.add(v)
            node = v.producer()
            if node is None:
                return False
            more = self._visit(node, writes=True)
            if more is None:
                return False
            todo += more
            for use in v.uses():
                more = self._visit(use.node, writes=False, idx=use.idx)
                if more is None:
                    return False
                todo += more
        return True

    def _visit(self, node: ir.Node, *, writes: bool, idx: int = 0):
        """The region values ``node`` adds, or None if it cannot be padded."""
        if not _default(node) or len(node.outputs) != 1:
            return None
        if _is_depthwise(node) and _weight(node).shape[0] == self.c:
            self.inner.add(node)
            return [node.inputs[0], node.outputs[0]]
        if _plain_conv(node):
            w = _weight(node)
            if writes and w.shape[0] == self.c:
                self.writers.add(node)
                return []
            if not writes and idx == 0 and w.shape[1] == self.c:
                self.readers.add(node)
                return []
            return None
        if node.op_type in ELEMENTWISE or node.op_type in POOLS:
            # extra inputs (Clip's bounds) must be one value each
            for u in node.inputs[1:]:
                a = const_array(u) if u is not None else None
                if u is not None and (a is None or a.size != 1):
                    return None
            self.inner.add(node)
            return [node.inputs[0], node.outputs[0]]
        if node.op_type in BINARY and len(node.inputs) == 2:
            acts = []
            for u in node.inputs:
                a = const_array(u)
                if a is None:
                    acts.append(u)  # checked as a region value
                elif not (
                    a.dtype == np.float32 and (a.size == 1 or is_channel_constant(a, self.c))
                ):
                    return None
            self.inner.add(node)
            return [*acts, node.outputs[0]]
        return None

    def growth(self) -> float:
        return (_padded(self.c) - self.c) / self.c


def _padded(c: int) -> int:
    return -(-c // ALIGN) * ALIGN


def _pad_axis(a: np.ndarray, axis: int, extra: int, *, copies: bool) -> np.ndarray:
    """``a`` with ``extra`` more entries along ``axis``: copies of the last one, or zeros."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return np.pad(a, widths, mode="edge") if copies else np.pad(a, widths)


def pad_depthwise(model: ir.Model) -> tuple[ir.Model, int]:
    """A copy of ``model`` whose depthwise Convs have a multiple of 16 channels where that can be
    done exactly (see the module's text), and how many depthwise Convs were padded."""
    m = copy_model(model)
    g = m.graph
    count = 0
    refused: set[ir.Node] = set()  # depthwise Convs of a region that cannot be padded
    with bulk_names(g):
        for node in list(g):
            # (a padded one is aligned now)
            if node in refused or not _is_depthwise(node) or _weight(node).shape[0] % ALIGN == 0:
                continue
            region = _Region(_weight(node).shape[0])
            if not region.grow(node.inputs[0]) or region.growth() > MAX_GROWTH:
                refused |= region.inner
                continue
            _pad(g, region)
            count += sum(_is_depthwise(n) for n in region.inner)
        remove_unused_initializers(g)
    return m, count


def _pad(g: ir.Graph, r: _Region) -> None:
    c2 = _padded(r.c)
    extra = c2 - r.c
    for node in r.writers | {n for n in r.inner if _is_depthwise(n)}:
        _set_const(g, node, 1, _pad_axis(_weight(node), 0, extra, copies=True))
        if _bias(node) is not None:
            _set_const(g, node, 2, _pad_axis(_bias(node), 0, extra, copies=True))
        if node in r.inner:
            node.attributes["group"] = ir.AttrInt64("group", c2)
    for node in r.readers:
        _set_const(g, node, 1, _pad_axis(_weight(node), 1, extra, copies=False))
    for node in r.inner:
        if node.op_type in BINARY:
            for i, u in enumerate(node.inputs):
                a = const_array(u)
                if a is not None and a.size > 1:
                    _set_const(g, node, i, _pad_axis(a, a.ndim - 3, extra, copies=True))
    for v in r.values:
        if v.shape is not None:
            dims = list(v.shape)
            dims[1] = c2
            v.shape = ir.Shape(dims)


def _set_const(g: ir.Graph, node: ir.Node, idx: int, arr: np.ndarray) -> None:
    # a new initializer: the old one may be shared with nodes outside the region
    node.replace_input_with(idx, constant(g, arr.astype(np.float32), f"{node.name}_padded"))
