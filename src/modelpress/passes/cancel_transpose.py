"""Transpose∘Transpose → one Transpose with the composed permutation, or nothing when it is the identity.

``Transpose(Transpose(x, p1), p2)`` moves output axis ``j`` from axis ``p1[p2[j]]`` of ``x``, so it
equals ``Transpose(x, p1∘p2)``; when that is the identity permutation the pair is ``x`` itself.

Legal always: both are pure data movement (the ``check`` refuses only a pair in two graphs, or
permutations of unequal length). The outer Transpose is rewritten to read ``x``; the inner one is
removed when nothing else uses it (when something does, it stays for that user and the rewrite
still saves one pass over the data). A missing ``perm`` means "reverse the axes", which
needs the rank; two reversals cancel whatever the rank, otherwise the rank must be known.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from modelpress.ir.graph import insert_node, replace_value, replace_with_new
from modelpress.ir.match import known_rank
from modelpress.passes.rule import Pair, PairRewritePass


def _perm(node: ir.Node, rank: int | None) -> list[int] | None:
    attr = node.attributes.get("perm")
    if attr is not None:
        return [int(p) for p in attr.as_ints()]
    return list(reversed(range(rank))) if rank is not None else None


@dataclass
class _Match(Pair):
    # derived by the check: the composed permutation (None: reverse∘reverse, the identity)
    composed: list[int] | None = None


class CancelTranspose(PairRewritePass[_Match]):
    """Transpose(Transpose(x, p1), p2) → Transpose(x, p1∘p2), or x when that is the identity."""

    name = "cancel-transpose"
    ops = ("Transpose",)
    match_type = _Match

    def check_pair(self, graph, m: _Match) -> str | None:
        if "perm" not in m.inner.attributes and "perm" not in m.outer.attributes:
            return None  # reverse∘reverse: the identity at any rank
        rank = known_rank(m.inner.inputs[0])
        if rank is None:
            given = m.inner.attributes.get("perm") or m.outer.attributes.get("perm")
            rank = len(given.as_ints())
        p1, p2 = _perm(m.inner, rank), _perm(m.outer, rank)
        if len(p1) != len(p2):
            return f"the permutations {p1} and {p2} differ in length"
        m.composed = [p1[j] for j in p2]
        return None

    def rewrite(self, graph, m: _Match) -> int:
        x, out = m.inner.inputs[0], m.outer.outputs[0]
        identity = m.composed is None or m.composed == list(range(len(m.composed)))
        if not (identity and replace_value(out, x)):
            # Not the identity, or the identity of a graph input onto a graph output (whose names
            # are fixed): one Transpose (or Identity) reading x replaces the pair.
            if identity:
                new = insert_node(graph, m.outer, "Identity", [x], like=out)
            else:
                new = insert_node(graph, m.outer, "Transpose", [x], {"perm": m.composed}, like=out)
            replace_with_new(out, new.outputs[0])
        return self.remove_pair(graph, m)
