"""No-op elimination: remove nodes whose output always equals one of their inputs.

The rewrite is ``y = Op(x, ...)`` → ``x`` (consumers of ``y`` read ``x``; a graph output keeps its
name). It is legal only when ``y`` equals ``x`` for *every* input the model accepts, dynamic
dimensions included, so each rule below (``RULES``, the precondition per op: it returns the input
the node returns, or why that is not known) checks what is known statically:

- Dropout in inference (``training_mode`` absent or constant false, not the old ``is_test=0``) whose
  mask output is unused: inference-mode Dropout is the identity.
- Cast / CastLike to the type the input already has.
- Reshape whose target equals the input's shape, dimension by dimension (``0`` copies a dimension
  unless ``allowzero``; one ``-1`` is allowed when every other dimension matches, so a dynamic
  dimension stays dynamic), or is ``Shape(x)`` of the input itself; Expand to ``Shape(x)``.
- Expand to a shape whose entries are 1 or equal to the input's static dimensions and whose rank is
  not larger: broadcasting then changes nothing.
- Transpose with the identity permutation; Pad with all-zero pads; Slice whose every sliced axis
  starts at 0, ends past the end and steps by 1; Unsqueeze with no axes; Squeeze with no axes on a
  static shape without size-1 dimensions; Concat of a single input.
- ``x*1``, ``1*x``, ``x+0``, ``0+x``, ``x-0``, ``x/1`` when the constant is all ones (zeros) and
  broadcasting it against ``x`` cannot change ``x``'s shape (the constant's rank is not larger and
  each of its dimensions is 1 or equal to ``x``'s static dimension); ONNX gives both operands the
  same type, so the dtype cannot change either. (``x+0`` turns ``-0.0`` into ``+0.0``; every
  optimizer accepts that, as no comparison or arithmetic downstream can tell them apart except
  division by zero.)

A node writing a graph output is replaced only by a value that can take the output's name
(``rule.output_refusal``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.match import const_array
from modelpress.ir.shapes import ensure_types
from modelpress.passes.rule import RewritePass, output_refusal, replace_all

# Exporters write "until the end" as INT64_MAX (PyTorch) or INT32_MAX (TensorFlow); a dynamic axis
# longer than 2**31 - 1 elements is not a case any model has, so either means "to the end".
_TO_THE_END = 2**31 - 1


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _dims(value: ir.Value | None) -> list[int | ir.SymbolicDim] | None:
    if value is None or value.shape is None:
        return None
    return list(value.shape)


def _ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def _unused(value: ir.Value) -> bool:
    return not value.uses() and not value.is_graph_output()


# Each rule returns the input that ``node`` provably returns, or (a str) why that is not known.
Rule = Callable[[ir.Node], "ir.Value | str"]


def _dropout(node: ir.Node) -> ir.Value | str:
    if node.attributes.get_int("is_test", 1) == 0:  # opset < 7 training mode
        return "training mode (is_test=0)"
    if len(node.outputs) > 1 and not _unused(node.outputs[1]):
        return "its mask output is used"
    training = _input(node, 2)
    if training is not None:
        flag = const_array(training)
        if flag is None or bool(flag.reshape(-1)[0]):
            return "training_mode is not a constant false"
    return node.inputs[0]


def _cast(node: ir.Node) -> ir.Value | str:
    x = node.inputs[0]
    if x.dtype is None:
        return "the input's dtype is not known"
    to = node.attributes.get_int("to", -1)
    return x if x.dtype.value == to else "it changes the dtype"


def _cast_like(node: ir.Node) -> ir.Value | str:
    x, like = node.inputs[0], _input(node, 1)
    if like is None or x.dtype is None:
        return "the input's dtype is not known"
    return x if x.dtype == like.dtype else "it changes the dtype"


def _is_shape_of(value: ir.Value | None, x: ir.Value) -> bool:
    """Whether ``value`` is ``Shape(x)`` (all of it): x's own shape, static or not."""
    producer = value.producer() if value is not None else None
    return (
        producer is not None
        and producer.op_type == "Shape"
        and producer.domain in ("", "ai.onnx")
        and producer.inputs[0] is x
        and "start" not in producer.attributes
        and "end" not in producer.attributes
    )


def _to_target(node: ir.Node) -> ir.Value | str:
    """Reshape and Expand, to a target shape (their second input): the input itself when the
    target is ``Shape(x)``, or a constant that ``_TARGET_REFUSALS`` finds keeps x's shape."""
    x = node.inputs[0]
    if _is_shape_of(_input(node, 1), x):
        return x
    dims = _dims(x)
    target = const_array(_input(node, 1))
    if dims is None or target is None or target.ndim != 1:
        return "the input's shape or the target shape is not known"
    reason = _TARGET_REFUSALS[node.op_type](node, dims, target.tolist())
    return x if reason is None else reason


def _reshape_refusal(node: ir.Node, dims: list, target: list[int]) -> str | None:
    if len(target) != len(dims):
        return "the target's rank differs from the input's"
    allowzero = node.attributes.get_int("allowzero", 0) == 1
    minus_one = 0
    for want, dim in zip(target, dims, strict=True):
        if want == 0 and not allowzero:
            continue  # copies the input's dimension
        if want == -1:
            minus_one += 1
        elif not (isinstance(dim, int) and dim == want):
            return f"the target {target} is not known to equal the input's shape"
    # With every other dimension equal, a single -1 can only resolve to the input's own dimension,
    # unless a literal zero-size dimension (allowzero) makes it ambiguous.
    if minus_one > 1 or (minus_one and allowzero and 0 in target):
        return "more than one -1, or a -1 beside a literal 0"
    return None


def _expand_refusal(node: ir.Node, dims: list, shape: list[int]) -> str | None:
    if len(shape) > len(dims):
        return "the target has a higher rank than the input"
    for want, dim in zip(shape[::-1], dims[::-1], strict=False):
        if want != 1 and not (isinstance(dim, int) and dim == want):
            return f"the target {shape} may broadcast the input"
    return None


_TARGET_REFUSALS = {"Reshape": _reshape_refusal, "Expand": _expand_refusal}


def _transpose(node: ir.Node) -> ir.Value | str:
    x = node.inputs[0]
    perm = _ints(node, "perm")
    if perm is None:  # the default reverses the axes: the identity only up to rank 1
        dims = _dims(x)
        return (
            x
            if dims is not None and len(dims) <= 1
            else "it reverses the axes of a rank that is not known to be <= 1"
        )
    return x if perm == list(range(len(perm))) else "the permutation is not the identity"


def _pad(node: ir.Node) -> ir.Value | str:
    pads = _ints(node, "pads")  # opset < 11 keeps pads in an attribute
    if pads is None:
        arr = const_array(_input(node, 1))
        if arr is None:
            return "the pads are not a constant"
        pads = arr.reshape(-1).tolist()
    return node.inputs[0] if not any(pads) else "the pads are not all zero"


def _slice(node: ir.Node) -> ir.Value | str:
    x = node.inputs[0]
    dims = _dims(x)
    if dims is None:
        return "the input's shape is not known"
    if node.attributes.get("starts") is not None:  # opset < 10: attributes
        starts, ends = _ints(node, "starts"), _ints(node, "ends")
        axes, steps = _ints(node, "axes"), None
    else:
        arrays = [const_array(_input(node, i)) for i in range(1, 5)]
        for i, arr in enumerate(arrays):
            if arr is None and _input(node, i + 1) is not None:
                return "a parameter is not a constant"
        if arrays[0] is None or arrays[1] is None:
            return "starts or ends are missing"
        starts, ends = arrays[0].tolist(), arrays[1].tolist()
        axes = arrays[2].tolist() if arrays[2] is not None else None
        steps = arrays[3].tolist() if arrays[3] is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        if step != 1 or axis < -len(dims) or axis >= len(dims):
            return f"axis {axis}: a step other than 1, or no such axis"
        dim = dims[axis]
        static = isinstance(dim, int)
        starts_at_zero = start == 0 or (static and start <= -dim)
        ends_at_end = end >= _TO_THE_END or (static and end >= dim)
        if not (starts_at_zero and ends_at_end):
            return f"axis {axis}: [{start}:{end}] is not known to keep the whole axis"
    return x


def _axes(node: ir.Node) -> list[int] | None:
    """The axes of Squeeze/Unsqueeze ([] when absent), or None when they are a runtime value."""
    attr = _ints(node, "axes")
    if attr is not None:
        return attr
    value = _input(node, 1)
    if value is None:
        return []
    arr = const_array(value)
    return None if arr is None else arr.reshape(-1).tolist()


def _squeeze(node: ir.Node) -> ir.Value | str:
    dims = _dims(node.inputs[0])
    if _axes(node) != [] or dims is None:
        return "it has axes, or the input's shape is not known"
    # Without axes Squeeze drops every size-1 dimension found at run time.
    if all(isinstance(d, int) and d != 1 for d in dims):
        return node.inputs[0]
    return "the input may have a size-1 dimension"


def _unsqueeze(node: ir.Node) -> ir.Value | str:
    return node.inputs[0] if _axes(node) == [] else "it has axes"


def _concat(node: ir.Node) -> ir.Value | str:
    return node.inputs[0] if len(node.inputs) == 1 else "more than one input"


def _broadcast_keeps_shape(x: ir.Value, constant: np.ndarray) -> bool:
    if constant.ndim == 0:
        return True
    dims = _dims(x)
    if dims is None or constant.ndim > len(dims):
        return False
    return all(
        c == 1 or (isinstance(d, int) and d == c)
        for c, d in zip(constant.shape[::-1], dims[::-1], strict=False)
    )


def _neutral(identity: float, *, commutative: bool) -> Rule:
    """A rule for a binary op whose constant operand ``identity`` leaves the other one unchanged."""

    def rule(node: ir.Node) -> ir.Value | str:
        if len(node.inputs) != 2:
            return "not a binary node"
        sides = [(0, 1), (1, 0)] if commutative else [(0, 1)]
        for keep, const in sides:
            x, c = node.inputs[keep], const_array(node.inputs[const])
            if x is None or c is None or c.dtype == object:
                continue
            if np.all(c == identity) and _broadcast_keeps_shape(x, c):
                return x
        return f"no operand is a constant {identity:g} that keeps the other's shape"

    return rule


RULES: dict[str, Rule] = {
    "Dropout": _dropout,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Reshape": _to_target,
    "Expand": _to_target,
    "Transpose": _transpose,
    "Pad": _pad,
    "Slice": _slice,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Mul": _neutral(1, commutative=True),
    "Add": _neutral(0, commutative=True),
    "Sub": _neutral(0, commutative=False),
    "Div": _neutral(1, commutative=False),
}


@dataclass
class _Match:
    node: ir.Node
    # derived by the check: the input the node returns
    source: ir.Value | None = None


class EliminateNoOps(RewritePass[_Match]):
    """Replace a node that provably returns its input by that input (rules in the module doc)."""

    name = "noop"
    level = 1
    ops = tuple(RULES)

    def call(self, model: ir.Model):
        ensure_types(model)
        return super().call(model)

    def matches(self, graph, node: ir.Node) -> Iterator[_Match]:
        if node.inputs and node.inputs[0] is not None:
            yield _Match(node)

    def check(self, graph, m: _Match) -> str | None:
        source = RULES[m.node.op_type](m.node)
        if isinstance(source, str):
            return source
        m.source = source
        return output_refusal(m.node.outputs[0], source, graph)

    def rewrite(self, graph, m: _Match) -> int:
        replace_all(m.node.outputs[0], m.source)
        graph.remove(m.node, safe=True)
        return 1
