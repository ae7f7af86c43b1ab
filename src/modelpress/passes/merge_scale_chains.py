"""Collapse chains of element-wise Mul/Add/Sub/Div by constants (and Neg) into one affine map.

Every link of such a chain is an affine map of the running value ``v``: ``v·a``, ``v + b``,
``v - b`` (= ``v + (-b)``), ``b - v`` (= ``v·(-1) + b``), ``v / a`` (= ``v·(1/a)``), ``-v``. Their
composition is again ``x·s + t``, which is written as at most two ops:

- ``(x·a)·b`` → ``x·(a·b)``; ``(x + a) + b`` → ``x + (a + b)``; ``-(x + a)`` → ``(-a) - x``;
- ``(x + a)·b`` → ``x·b + a·b`` (two ops either way, but in the order Conv fusions and the next
  chain merge expect);
- ``(x·a) + b`` is already in that form and stays.

The pattern (``matches``): the longest chain of links whose intermediate values have exactly one
reader and are no graph output (otherwise they are still needed as they were), each link floating
point with every constant finite, and Div constants without zero (``x/0`` and ``x·(1/0)`` agree,
but combined with other links NaN and inf would not; integer Div truncates and is not a
multiplication). Precondition (``check``): the chain has one dtype; the merged constants are no
larger than the largest original one (two constants shaped ``(C,1)`` and ``(1,W)`` would merge into
a ``(C,W)`` one); and the result saves an op, or puts an Add before a Mul into Mul-then-Add order.
The output's shape is the broadcast of ``x`` with all constants in both
forms, so it cannot change; a link whose merged constant is neutral (all ones, all zeros) is
dropped only when its shape adds nothing to that broadcast. Constants are combined in float64 and
cast back, so results differ only by float rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, insert_node, replace_with_new
from modelpress.ir.match import const_array, is_single_use
from modelpress.ir.shapes import ensure_types
from modelpress.passes.rule import FusionPass

_OPS = ("Mul", "Add", "Sub", "Div", "Neg")

# A step of an affine chain: ("mul", a) means v·a, ("add", b) means v + b.
Step = tuple[str, np.ndarray]


def _link(node: ir.Node) -> tuple[ir.Value, list[Step], np.dtype] | None:
    """``(x, steps, dtype)`` when ``node`` is an affine map of its one non-constant input x."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _OPS or len(node.outputs) != 1:
        return None
    if node.op_type == "Neg":
        x = node.inputs[0]
        if x is None or x.dtype is None or not x.dtype.is_floating_point():
            return None
        dtype = np.dtype(x.dtype.numpy())
        return x, [("mul", np.array(-1.0))], dtype
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    a, b = node.inputs
    ca, cb = const_array(a), const_array(b)
    if (ca is None) == (cb is None):  # both variable, or both constant (constant folding's job)
        return None
    c = cb if cb is not None else ca
    x = a if cb is not None else b
    if c.dtype.kind != "f" or not np.all(np.isfinite(c)):
        return None
    if x.dtype is not None and np.dtype(x.dtype.numpy()) != c.dtype:
        return None
    c64 = c.astype(np.float64)
    op, x_first = node.op_type, cb is not None
    if op == "Mul":
        steps = [("mul", c64)]
    elif op == "Add":
        steps = [("add", c64)]
    elif op == "Sub":
        steps = [("add", -c64)] if x_first else [("mul", np.array(-1.0)), ("add", c64)]
    elif x_first and np.all(c64 != 0):  # Div(x, c); Div(c, x) is not affine
        steps = [("mul", 1.0 / c64)]
    else:
        return None
    return x, steps, c.dtype


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _plan(s: np.ndarray, t: np.ndarray, s_used: bool, t_used: bool) -> list[str]:
    """The ops that compute ``x·s + t``: Mul then Add, or Sub/Neg when s is -1."""
    shape_s = s.shape if s_used else ()
    shape_t = t.shape if t_used else ()
    both = _broadcast(shape_s, shape_t)
    # A neutral constant may be dropped only when the other one alone broadcasts to the same shape.
    need_s = s_used and not (np.all(s == 1) and both == shape_t)
    need_t = t_used and not (np.all(t == 0) and both == shape_s)
    if not need_s and not need_t:
        # The chain cancels out; one op stays so that the output keeps its broadcast shape (the
        # no-op pass removes it when that is legal).
        return ["Mul"] if s_used else ["Add"]
    if need_s and np.all(s == -1):
        if need_t and both == shape_t:
            return ["Sub"]
        if not need_t and s.ndim == 0:
            return ["Neg"]
    return (["Mul"] if need_s else []) + (["Add"] if need_t else [])


@dataclass
class _Match:
    chain: list[
        tuple[ir.Node, ir.Value, list[Step], np.dtype]
    ]  # (node, x, steps, dtype), first first
    # derived by the check: x·s + t, written as the ops of ``plan``
    s: np.ndarray | None = None
    t: np.ndarray | None = None
    plan: list[str] | None = None


class MergeScaleChains(FusionPass[_Match]):
    """Merge a chain of constant Mul/Add/Sub/Div/Neg into ``x·s + t`` (rules in the module doc)."""

    name = "merge-scale-chains"
    ops = _OPS

    def call(self, model: ir.Model):
        ensure_types(model)  # Neg links need their input's dtype
        return super().call(model)

    def matches(self, graph, tail: ir.Node) -> Iterator[_Match]:
        if _link(tail) is None:
            return
        chain = self._chain_ending_at(tail)
        if len(chain) >= 2:
            yield _Match(chain)

    @staticmethod
    def _chain_ending_at(tail: ir.Node) -> list[tuple[ir.Node, ir.Value, list[Step], np.dtype]]:
        """The longest chain of links ending at ``tail`` whose intermediate values have one reader.

        Empty when ``tail``'s own output continues the chain (the chain is handled at its end).
        """
        out = tail.outputs[0]
        if is_single_use(out):
            reader = out.uses()[0].node
            link = _link(reader)
            if link is not None and link[0] is out:
                return []
        chain = []
        node: ir.Node | None = tail
        while node is not None and node.graph is tail.graph:
            link = _link(node)
            if link is None or (chain and not is_single_use(node.outputs[0])):
                break
            chain.insert(0, (node, *link))
            node = link[0].producer()
        return chain

    def check(self, graph, m: _Match) -> str | None:
        chain = m.chain
        dtype = chain[0][3]
        if any(d != dtype for *_, d in chain):
            return "the links differ in dtype"
        s, t = np.array(1.0), np.array(0.0)
        s_used = t_used = False
        kinds: list[str] = []
        for _, _, steps, _ in chain:
            for kind, c in steps:
                kinds.append(kind)
                if kind == "mul":
                    s, t, s_used = s * c, t * c, True
                else:
                    t, t_used = t + c, True
        largest = max(c.size for _, _, steps, _ in chain for _, c in steps)
        if s.size > largest or t.size > largest:
            return "the merged constants would be larger than any of the originals"
        plan = _plan(s, t, s_used, t_used)
        ops = [node.op_type for node, *_ in chain]
        # Rewrite when it saves ops, or to put an Add before a Mul into Mul-then-Add order.
        reorders = "add" in kinds and "mul" in kinds[kinds.index("add") :]
        if not (len(plan) < len(ops) or (len(plan) == len(ops) and reorders and plan != ops)):
            return f"{' → '.join(plan)} saves no op over {' → '.join(ops)} and reorders nothing"
        m.s, m.t, m.plan = s, t, plan
        return None

    def rewrite(self, graph, m: _Match) -> int:
        x, dtype = m.chain[0][1], m.chain[0][3]
        last = m.chain[-1][0]
        y = last.outputs[0]
        value = x
        for i, op in enumerate(m.plan):
            # Only the last op's output is known to have y's shape; earlier ones share its dtype.
            like = y if i == len(m.plan) - 1 else None
            if op == "Neg":
                node = insert_node(graph, last, "Neg", [value], like=like)
            elif op == "Sub":
                shift = add_initializer(graph, m.t.astype(dtype), "merged_shift")
                node = insert_node(graph, last, "Sub", [shift, value], like=like)
            elif op == "Mul":
                scale = add_initializer(graph, m.s.astype(dtype), "merged_scale")
                node = insert_node(graph, last, "Mul", [value, scale], like=like)
            else:
                shift = add_initializer(graph, m.t.astype(dtype), "merged_shift")
                node = insert_node(graph, last, "Add", [value, shift], like=like)
            node.outputs[0].type = y.type
            # onnx_ir names new values per graph ("val_0"), which may clash with a name of an
            # enclosing graph inside a subgraph; a name derived from y's is unique in the model.
            if y.name:
                node.outputs[0].name = f"{y.name}_affine{i}"
            value = node.outputs[0]
        replace_with_new(y, value)
        for node, *_ in reversed(m.chain):
            graph.remove(node, safe=True)
        return 1
