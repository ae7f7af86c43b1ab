"""Clean-up passes that reuse onnx_ir's own: dead nodes, unused initializers, identities, CSE,
duplicate initializers.

Each wraps an ``onnx_ir`` pass (which handles subgraphs itself) and counts its rewrites as the
number of nodes and initializers that disappeared.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_ir.passes import PassResult

from modelpress.ir.graph import replace_value
from modelpress.ir.stats import iter_graphs, iter_nodes
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import register


def _size(model: ir.Model) -> int:
    nodes = sum(1 for _ in iter_nodes(model.graph))
    inits = sum(len(g.initializers) for g in iter_graphs(model.graph))
    return nodes + inits


class _WrappedPass(GraphPass):
    recurse = False
    level = 1

    def make(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, model: ir.Model) -> PassResult:
        self.model = model
        before = _size(model)
        result = self.make()(model)
        removed = max(before - _size(result.model), 0)
        self.rewrites += removed
        return PassResult(result.model, modified=removed > 0)


@register
class RemoveDeadCode(_WrappedPass):
    """Remove nodes whose outputs nobody uses, and initializers nobody reads.

    Legal always: a graph's result depends only on what reaches its outputs. Nodes with side
    effects do not exist in the standard domains.
    """

    name = "dead-code"

    def make(self):
        return ir.passes.Sequential(
            common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass()
        )


@register
class EliminateIdentity(GraphPass):
    """Identity(x) → x.

    Legal always, with one care for graph outputs: the output keeps its name, and a subgraph whose
    output would become a value of an enclosing graph (or its own input) keeps its Identity, since
    ONNX Runtime rejects a body that returns an outer value directly and a Scan/Loop body that
    passes state through must still produce it.
    """

    name = "identity"
    level = 1

    def rewrite_graph(self, graph) -> int:
        count = 0
        for node in list(graph):
            if node.op_type != "Identity" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
                continue
            if replace_value(node.outputs[0], node.inputs[0]):
                graph.remove(node, safe=True)
                count += 1
        return count


@register
class CommonSubexpressions(_WrappedPass):
    """Two nodes with the same op, attributes and inputs compute the same value: keep one.

    Legal for deterministic ops; onnx_ir's pass skips the random ones (RandomNormal, ...).
    """

    name = "cse"
    level = 2

    def make(self):
        return common.CommonSubexpressionEliminationPass()


@register
class DeduplicateInitializers(_WrappedPass):
    """Initializers with equal dtype, shape and bytes become one. Legal always."""

    name = "dedup-initializers"

    def make(self):
        return common.DeduplicateHashedInitializersPass()
