"""Move crops (Slice, Gather on a constant index) ahead of element-wise ops.

``crop(f(x, c))`` → ``f(crop(x), crop'(c))``: an element-wise ``f`` computes each output element
from the elements at the same position (after broadcasting), so cropping first gives the same
values while ``f`` runs on fewer elements. ``crop'`` crops each constant operand ``c`` the same way
along the axes it shares with ``x``; a constant of size 1 on a cropped axis broadcasts and stays as
it is (a scalar Gather index removes that axis from it).

Precondition (``check``):

- the crop's parameters are constants (Slice starts/ends/axes/steps, Gather indices) and ``f`` is
  element-wise with exactly one non-constant tensor operand ``x`` (Clip's min/max are scalars and
  pass through unchanged);
- every constant ``c`` has rank ≤ rank(``x``) (so ``f`` keeps ``x``'s rank; the rank must then be
  known), and on each cropped axis where ``c`` has size > 1, ``x``'s size is that same known
  integer: if it could be 1, ``x`` would broadcast and cropping it first would be wrong. Dynamic
  dimensions elsewhere are fine;
- it saves work. When ``f``'s result feeds only this crop, a Slice never enlarges it and a Gather
  must keep at most the axis' length. When it feeds several crops (and nothing else), ``f`` is
  duplicated per crop, which pays only if the crops together keep fewer elements than ``f``
  produces; that needs static shapes, and the pass declines otherwise. Any other use (or a graph
  output) blocks the move.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, remove_node, replace_with_new
from modelpress.ir.match import const_array, in_graph, known_rank, slice_params, static_shape
from modelpress.passes.rule import RewritePass

_UNARY = frozenset(
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Cast Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu "
    "HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu Round "
    "Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu".split()
)
# Every tensor input broadcasts against the others (multidirectional, or PRelu's slope onto x).
_BROADCAST = frozenset(
    "Add And BitShift BitwiseAnd BitwiseOr BitwiseXor Div Equal Greater GreaterOrEqual Less "
    "LessOrEqual Max Mean Min Mod Mul Or Pow PRelu Sub Sum Where Xor".split()
)
# Inputs past the first are scalars (min, max): they pass through unchanged.
_SCALAR_TAIL = frozenset({"Clip"})


@dataclass(frozen=True)
class _Crop:
    """One crop node, its axes normalized when the rank is known."""

    node: ir.Node
    axes: list[int]
    slices: list[tuple[int, int, int]] | None = None  # Slice: (start, end, step) per axis
    index: np.ndarray | None = None  # Gather: the constant indices

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.index is not None:
            a = self.axes[0]
            return shape[:a] + self.index.shape + shape[a + 1 :]
        out = list(shape)
        for a, (s, e, st) in zip(self.axes, self.slices, strict=True):
            out[a] = len(range(*slice(s, e, st).indices(shape[a])))
        return tuple(out)

    def crop_constant(self, c: np.ndarray, rank: int) -> np.ndarray:
        """``c`` (aligned to the right of a rank-``rank`` tensor) cropped as the tensor is."""
        offset = rank - c.ndim
        if self.index is not None:
            ac = self.axes[0] - offset
            if ac < 0:
                return c
            # Broadcast along the axis: it becomes size-1 axes, as many as the index has.
            if c.shape[ac] == 1:
                return c.reshape(c.shape[:ac] + (1,) * self.index.ndim + c.shape[ac + 1 :])
            return np.take(c, self.index, axis=ac)
        index = [slice(None)] * c.ndim
        for a, (s, e, st) in zip(self.axes, self.slices, strict=True):
            ac = a - offset
            if ac >= 0 and c.shape[ac] > 1:
                index[ac] = slice(s, e, st)
        return c[tuple(index)]


def _as_crop(node: ir.Node, rank: int | None) -> _Crop | None:
    if node.domain != "":
        return None
    if node.op_type == "Slice":
        params = slice_params(node)
        if params is None:
            return None
        starts, ends, axes, steps = params
        if rank is not None:
            axes = [a + rank if a < 0 else a for a in axes]
        return _Crop(node, axes, slices=list(zip(starts, ends, steps, strict=True)))
    if node.op_type == "Gather":
        index = const_array(node.inputs[1])
        if index is None or index.dtype.kind not in "iu":
            return None
        axis = node.attributes.get_int("axis", 0)
        if rank is not None and axis < 0:
            axis += rank
        return _Crop(node, [axis], index=index.astype(np.int64))
    return None


def _broadcast_positions(node: ir.Node) -> list[int] | None:
    if node.domain != "" or len(node.outputs) != 1:
        return None
    if node.op_type in _UNARY or node.op_type in _SCALAR_TAIL:
        return [0]
    if node.op_type in _BROADCAST:
        return list(range(len(node.inputs)))
    return None


def _copy_attributes(node: ir.Node) -> list[ir.Attr]:
    return [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]


@dataclass
class _Match:
    data: ir.Value  # f's result, which the crops read
    elem: ir.Node  # the element-wise f
    positions: list[int]  # f's inputs that broadcast against each other
    # derived by the check
    k: int = 0  # the position of x, f's one non-constant operand
    consts: dict[int, np.ndarray] | None = None  # the constant operands by position
    rank: int | None = None
    crops: list[_Crop] | None = None  # every reader of f's result


class ReorderCrop(RewritePass[_Match]):
    """crop(f(x, c)) → f(crop(x), crop(c)) for element-wise f, when it is legal and saves work."""

    name = "reorder-crop"
    ops = ("Slice", "Gather")

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        # A crop moves up a chain of element-wise ops one step per sweep.
        count = 0
        while moved := super().rewrite_graph(graph):
            count += moved
        return count

    def matches(self, graph, crop_node: ir.Node) -> Iterator[_Match]:
        data = crop_node.inputs[0] if crop_node.inputs else None
        elem = data.producer() if data is not None else None
        positions = _broadcast_positions(elem) if elem is not None else None
        if positions is not None:
            yield _Match(data, elem, positions)

    def check(self, graph, m: _Match) -> str | None:
        if not in_graph(m.elem, graph):
            return f"the {m.elem.op_type} belongs to an enclosing graph"
        if m.data.is_graph_output():
            return f"the {m.elem.op_type} result is a graph output"
        inputs = list(m.elem.inputs)
        varying = [
            i for i in m.positions if inputs[i] is not None and const_array(inputs[i]) is None
        ]
        if len(varying) != 1:
            return f"the {m.elem.op_type} has {len(varying)} non-constant operands, not one"
        k = varying[0]
        x = inputs[k]
        consts = {
            i: const_array(inputs[i]) for i in m.positions if i != k and inputs[i] is not None
        }
        needs_rank = any(c.ndim > 0 for c in consts.values())
        rank = known_rank(x)
        if needs_rank and (rank is None or any(c.ndim > rank for c in consts.values())):
            return "a constant operand would raise the rank, or the rank is unknown"
        if any(use.idx != 0 for use in m.data.uses()):
            return f"the {m.elem.op_type} result is read as something other than a crop's data"
        crops = [_as_crop(use.node, rank) for use in m.data.uses()]
        if any(c is None for c in crops):
            return f"a reader of the {m.elem.op_type} result is not a crop with constant parameters"
        for crop in crops:
            reason = self._constants_refusal(crop, x, consts, rank) if needs_rank else None
            if reason is not None:
                return reason
        if not self._saves_work(crops, x, m.elem, consts):
            return "cropping first would not compute fewer elements"
        m.k, m.consts, m.rank, m.crops = k, consts, rank, crops
        return None

    def rewrite(self, graph, m: _Match) -> int:
        for crop in m.crops:
            self._move(graph, crop, m.elem, m.k, m.consts, m.rank)
        remove_node(graph, m.elem)
        return len(m.crops)

    @staticmethod
    def _constants_refusal(crop: _Crop, x: ir.Value, consts: dict, rank: int) -> str | None:
        """Why cropping the constants as ``crop`` crops x is not the same, or None."""
        for a in crop.axes:
            if not 0 <= a < rank:
                return f"the crop's axis {a} is not an axis of a rank-{rank} tensor"
            for c in consts.values():
                ac = a - (rank - c.ndim)
                if ac < 0 or c.shape[ac] == 1:
                    continue
                if x.shape[a] != c.shape[ac]:
                    # x could broadcast along a (unknown or size 1): unsafe
                    return (
                        f"a constant varies along axis {a}, where x is not known to have its size"
                    )
                d = c.shape[ac]
                if crop.index is not None and ((crop.index < -d) | (crop.index >= d)).any():
                    return "an index is out of range: the model fails at run time, and is left so"
        return None

    @staticmethod
    def _saves_work(crops: list[_Crop], x: ir.Value, elem: ir.Node, consts: dict) -> bool:
        if len(crops) == 1:
            crop = crops[0]
            if crop.index is None or crop.index.ndim == 0:
                return True
            a = crop.axes[0]
            dim = x.shape[a] if x.shape is not None and 0 <= a < x.shape.rank() else None
            return isinstance(dim, int) and crop.index.size <= dim
        shape = static_shape(elem.outputs[0])
        if shape is None:
            xs = static_shape(x)
            if xs is None:
                return False
            shape = tuple(np.broadcast_shapes(xs, *(c.shape for c in consts.values())))
        if any(not 0 <= a < len(shape) for crop in crops for a in crop.axes):
            return False
        kept = sum(math.prod(crop.out_shape(shape)) for crop in crops)
        return kept < math.prod(shape)

    def _move(
        self, graph, crop: _Crop, elem: ir.Node, k: int, consts: dict, rank: int | None
    ) -> None:
        old = crop.node
        out = old.outputs[0]
        x = elem.inputs[k]
        new_crop = ir.Node("", old.op_type, [x, *old.inputs[1:]], _copy_attributes(old))
        graph.insert_before(old, new_crop)
        if x.type is not None:
            new_crop.outputs[0].type = x.type
        new_inputs = list(elem.inputs)
        new_inputs[k] = new_crop.outputs[0]
        for i, c in consts.items():
            cropped = crop.crop_constant(c, rank) if c.ndim > 0 else c
            # Compare values, not shapes: a reversing Slice keeps the shape and moves the data.
            if cropped.shape != c.shape or not np.array_equal(cropped, c):
                new_inputs[i] = add_initializer(
                    graph, cropped, f"{elem.inputs[i].name or 'const'}_cropped"
                )
        new_elem = ir.Node("", elem.op_type, new_inputs, _copy_attributes(elem))
        graph.insert_before(old, new_elem)
        new_elem.outputs[0].type = out.type
        new_elem.outputs[0].shape = out.shape
        # Names derived from the crop's (unique) one: onnx_ir's per-graph default names ("val_0")
        # could repeat a name of an enclosing graph when this runs in a subgraph.
        new_crop.outputs[0].name = f"{out.name}_{old.op_type.lower()}" if out.name else None
        replace_with_new(out, new_elem.outputs[0])
        remove_node(graph, old)
