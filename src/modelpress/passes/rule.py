"""A local rewrite as three declared parts: the pattern, its precondition, the replacement.

Most passes find a small group of nodes around one anchor node and replace it. ``RewritePass``
runs such a pass; a subclass declares:

- ``ops``: the anchor's op types (standard domain); every node of those types, in graph order, is
  an anchor;
- ``matches(graph, node)``: the pattern at an anchor, as candidate matches (the bound nodes and
  values, one candidate per way the pattern can fit, e.g. per operand order). A node that is not
  the pattern yields nothing: that is no refusal, there was nothing to rewrite;
- ``check(graph, match)``: the precondition. ``None`` when the rewrite is legal (and worth it),
  else the reason it is not, in words: what is unknown, unequal or in the way. The check reads the
  graph and changes no node (it may complete type information); it may record on the match what
  it derived (folded weights, merged axes) so that the rewrite need not derive it again;
- ``rewrite(graph, match)``: builds the replacement and returns how many rewrites it made. It is
  only called after the check passed and never declines.

The first candidate of an anchor whose check passes is rewritten; each refused candidate is
logged with its reason (``GraphPass.refuse``). ``check_graph`` refuses a whole graph at once (an
opset without the op the rewrite needs).

Two common kinds have their own base: ``FusionPass`` (level 2, main graph and subgraphs, not local
functions) and ``PairRewritePass`` (two nodes of the pass's ops in a row become one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import onnx_ir as ir

from modelpress.ir.graph import remove_node, replace_value
from modelpress.ir.match import can_become_output_of, in_graph, is_single_use, producer_of
from modelpress.passes.base import GraphPass

M = TypeVar("M")

STANDARD_DOMAINS = ("", "ai.onnx")


class RewritePass(GraphPass, Generic[M]):
    """A pass made of local rewrites: ``matches`` → ``check`` → ``rewrite`` at every anchor."""

    #: op types of the anchor node, in the standard domain
    ops: tuple[str, ...] = ()

    def check_graph(self, graph: ir.Graph | ir.Function) -> str | None:
        """Why no rewrite can apply anywhere in ``graph`` (e.g. its opset is too old), or None."""
        return None

    def matches(
        self, graph: ir.Graph | ir.Function, node: ir.Node
    ) -> Iterable[M]:  # pragma: no cover
        raise NotImplementedError

    def check(self, graph: ir.Graph | ir.Function, match: M) -> str | None:  # pragma: no cover
        raise NotImplementedError

    def rewrite(self, graph: ir.Graph | ir.Function, match: M) -> int:  # pragma: no cover
        raise NotImplementedError

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        reason = self.check_graph(graph)
        if reason is not None:
            self.refuse(None, reason)
            return 0
        count = 0
        for node in list(graph):
            # An earlier rewrite of this sweep may have removed the node.
            if (
                node.op_type not in self.ops
                or node.domain not in STANDARD_DOMAINS
                or not in_graph(node, graph)
            ):
                continue
            count += self.rewrite_at(graph, node)
        return count

    def rewrite_at(self, graph: ir.Graph | ir.Function, node: ir.Node) -> int:
        """Rewrite the first candidate at ``node`` that passes the check; 0 when none does."""
        for match in self.matches(graph, node):
            reason = self.check(graph, match)
            if reason is None:
                return self.rewrite(graph, match)
            self.refuse(node, reason)
        return 0


class FusionPass(RewritePass[M]):
    """A level-2 rewrite that fuses nodes into one op or folds constants into a weight. It leaves
    local functions alone: there the weights are arguments, not constants, and a function holds no
    initializer for a folded one."""

    level = 2
    functions = False


@dataclass
class Pair:
    """Two nodes in a row: ``inner``'s output is ``outer``'s first input."""

    inner: ir.Node
    outer: ir.Node


P = TypeVar("P", bound=Pair)


class PairRewritePass(RewritePass[P]):
    """``outer(inner(x))``, two nodes of ``ops`` in a row, rewritten into one node (or ``x``).

    ``match_type`` is the pass's match class: a ``Pair``, with the fields its check derives.
    Every pair is checked first for an inner node in the rewritten graph itself (a subgraph's
    rewrite cannot remove a node of an enclosing graph), then by ``check_pair``; ``remove_pair``
    ends a rewrite.
    """

    match_type: type[Pair] = Pair

    def matches(self, graph: ir.Graph | ir.Function, node: ir.Node) -> Iterator[P]:
        inner = producer_of(node.inputs[0], *self.ops)
        if inner is not None:
            yield self.match_type(inner, node)

    def check(self, graph: ir.Graph | ir.Function, match: P) -> str | None:
        if not in_graph(match.inner, graph):
            return f"the inner {match.inner.op_type} belongs to an enclosing graph"
        return self.check_pair(graph, match)

    def check_pair(self, graph: ir.Graph | ir.Function, match: P) -> str | None:  # pragma: no cover
        raise NotImplementedError

    def remove_pair(self, graph: ir.Graph | ir.Function, match: P) -> int:
        """Remove ``outer``, whose output has been replaced, and ``inner`` unless something else
        reads it; one rewrite."""
        remove_node(graph, match.outer)
        if not any(v.uses() or v.is_graph_output() for v in match.inner.outputs):
            remove_node(graph, match.inner)
        return 1


def absorb_refusal(
    graph: ir.Graph | ir.Function, producer: ir.Node, value: ir.Value, because: str = ""
) -> str | None:
    """Why a fusion cannot absorb ``producer``, whose output ``value`` it consumes, or None: the
    producer belongs to an enclosing graph, or something else reads ``value`` (or it is a graph
    output), which would then still need it. ``because`` is added to the second reason."""
    if not in_graph(producer, graph):
        return f"the {producer.op_type} belongs to an enclosing graph"
    if not is_single_use(value):
        reason = f"the {producer.op_type} output has other readers or is a graph output"
        return f"{reason}: {because}" if because else reason
    return None


def output_refusal(old: ir.Value, new: ir.Value, graph: ir.Graph | ir.Function) -> str | None:
    """Why ``new`` cannot stand in for ``old`` everywhere (``replace_all``), or None.

    Only a graph output is in the way: it keeps its name, so ``new`` must take that name, which a
    graph input, output or initializer cannot (theirs are interface), and it must be computed in
    ``graph`` itself (a subgraph may not return an enclosing graph's value directly).
    """
    if old is new:
        return "the value would replace itself"
    if not old.is_graph_output():
        return None
    if not can_become_output_of(new, graph):
        return (
            "the result is a graph output, and what would replace it is not computed in this graph"
        )
    if new.is_graph_input() or new.is_graph_output() or new.is_initializer():
        return "the result is a graph output, and what would replace it has a fixed name"
    return None


def replace_all(old: ir.Value, new: ir.Value) -> None:
    """``replace_value(old, new)`` once ``output_refusal`` has admitted it."""
    replaced = replace_value(old, new)
    assert replaced, "output_refusal admitted a replacement that replace_value refuses"
