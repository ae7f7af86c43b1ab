"""Fold a zero constant Pad of the spatial axes into the Conv, AveragePool or MaxPool that reads it.

``Conv(Pad(x, p))`` = ``Conv(x)`` with ``pads += p``: Conv pads with zeros, so zero padding before it
and its own padding are the same thing. Precondition (``check``): the Pad is in constant mode with
value 0, its pads are constant, non-negative and leave the batch and channel axes alone, the
consumer has ``auto_pad`` NOTSET (explicit ``pads``) and reads the padded value as its data input,
and the padded value has no other reader and is no graph output.

Pooling needs more care:

- AveragePool: only with ``count_include_pad=1``, where the pool's own padding counts as zeros in
  the divisor exactly like padded elements do; and ``ceil_mode=0``.
- MaxPool pads with -inf, not 0. The two agree only when every window holds at least one real
  element (true with ``ceil_mode=0`` and every pad smaller than the kernel, which ONNX Runtime
  requires anyway) and the input is known to be non-negative, so that a padded 0 can never be the
  maximum of a window with a real element: we accept a Pad whose input comes from Relu, Sigmoid,
  Softplus, Abs, Exp, or a Clip with a constant minimum >= 0. The Indices output must be unused.

For both pools the combined pads must stay smaller than the kernel (ONNX Runtime rejects larger).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.match import attr, const_array, const_scalar, ints_arg, is_single_use, known_rank
from modelpress.passes.rule import FusionPass

_CONSUMERS = ("Conv", "AveragePool", "MaxPool")
_NON_NEGATIVE = ("Relu", "Sigmoid", "Softplus", "Abs", "Exp")


def _pad_amounts(pad: ir.Node, rank: int | None) -> list[int] | None:
    """Begin/end pads per axis, ``[b0, ..., b(r-1), e0, ..., e(r-1)]``, for a zero constant Pad."""
    if attr(pad, "mode", "constant") != "constant":
        return None
    if pad.attributes.get("pads") is not None:  # opset < 11: pads and value are attributes
        pads = list(attr(pad, "pads"))
        if float(attr(pad, "value", 0.0)) != 0.0:
            return None
    else:
        given, pads = ints_arg(pad, "pads", 1)
        if not given or pads is None:
            return None
        if len(pad.inputs) > 2 and pad.inputs[2] is not None:
            value = const_scalar(pad.inputs[2])
            if value is None or value != 0.0:
                return None
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:  # opset >= 18: pads of some axes only
            axes_array = const_array(pad.inputs[3])
            if axes_array is None or rank is None:
                return None
            axes = [int(a) % rank for a in axes_array.reshape(-1)]
            if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
                return None
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[rank + a] = pads[i], pads[len(axes) + i]
            pads = full
    if rank is not None and len(pads) != 2 * rank:
        return None
    return pads


def _non_negative(value: ir.Value) -> bool:
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _NON_NEGATIVE:
        return True
    if node.op_type == "Clip":
        low = attr(node, "min") if node.attributes.get("min") is not None else None
        if low is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            low = const_scalar(node.inputs[1])
        return low is not None and low >= 0.0
    return False


@dataclass
class _Match:
    pad: ir.Node
    consumer: ir.Node  # the Conv, AveragePool or MaxPool reading the padded value
    # derived by the check
    pads: list[int] | None = None  # the consumer's new pads


class FusePad(FusionPass[_Match]):
    """Pad (constant 0, spatial axes) + Conv / AveragePool / MaxPool → the consumer with larger pads."""

    name = "fuse-pad"
    ops = ("Pad",)

    def matches(self, graph, pad: ir.Node) -> Iterator[_Match]:
        for use in pad.outputs[0].uses():
            node = use.node
            if node.op_type in _CONSUMERS and node.domain in ("", "ai.onnx") and use.idx == 0:
                yield _Match(pad, node)

    def check(self, graph, m: _Match) -> str | None:
        pad, node = m.pad, m.consumer
        if not is_single_use(pad.outputs[0]):
            return "the padded value has other readers or is a graph output"
        if attr(node, "auto_pad", "NOTSET") != "NOTSET":
            return f"the {node.op_type} has auto_pad, not explicit pads"
        kernel = self._kernel(node)
        if kernel is None:
            return f"the {node.op_type}'s kernel shape is not known"
        rank = len(kernel) + 2
        x = pad.inputs[0]
        if known_rank(x) not in (None, rank):
            return f"the input has rank {known_rank(x)}, the {node.op_type} takes rank {rank}"
        pads = _pad_amounts(pad, rank)
        if pads is None or len(pads) != 2 * rank:
            return "the Pad is not a constant-mode zero padding with constant pads"
        if any(p < 0 for p in pads):
            return "the Pad crops (negative pads)"
        begin, end = pads[:rank], pads[rank:]
        if begin[:2] != [0, 0] or end[:2] != [0, 0]:
            return "the Pad pads the batch or channel axis, which is no convolution padding"
        spatial = len(kernel)
        old = list(attr(node, "pads", [0] * (2 * spatial)))
        new = [old[i] + begin[2 + i] for i in range(spatial)] + [
            old[spatial + i] + end[2 + i] for i in range(spatial)
        ]
        if node.op_type != "Conv":
            # ceil_mode and dilation can make windows that start inside the padding, where -inf
            # (MaxPool) and 0 differ; keep the proof simple and decline them.
            if int(attr(node, "ceil_mode", 0)) != 0 or any(
                d != 1 for d in attr(node, "dilations", [1])
            ):
                return f"the {node.op_type} has ceil_mode or dilations"
            if any(new[i] >= kernel[i] or new[spatial + i] >= kernel[i] for i in range(spatial)):
                return f"the combined pads would reach the {node.op_type}'s kernel size"
            if node.op_type == "AveragePool" and int(attr(node, "count_include_pad", 0)) != 1:
                return "the AveragePool does not count its own padding (count_include_pad=0)"
            if node.op_type == "MaxPool":
                if len(node.outputs) > 1 and (
                    node.outputs[1].uses() or node.outputs[1].is_graph_output()
                ):
                    return "the MaxPool's Indices output is used"
                if not _non_negative(x):
                    return (
                        "the input is not known to be non-negative: MaxPool pads with -inf, not 0"
                    )
        m.pads = new
        return None

    def rewrite(self, graph, m: _Match) -> int:
        m.consumer.attributes["pads"] = ir.AttrInt64s("pads", m.pads)
        m.consumer.replace_input_with(0, m.pad.inputs[0])
        m.pad.graph.remove(m.pad, safe=True)
        return 1

    @staticmethod
    def _kernel(node: ir.Node) -> list[int] | None:
        shape = attr(node, "kernel_shape")
        if shape is not None:
            return list(shape)
        if node.op_type == "Conv" and len(node.inputs) > 1:
            w = const_array(node.inputs[1])
            if w is not None:
                return list(w.shape[2:])
            if node.inputs[1].shape is not None and all(
                isinstance(d, int) for d in node.inputs[1].shape
            ):
                return list(node.inputs[1].shape)[2:]
        return None
