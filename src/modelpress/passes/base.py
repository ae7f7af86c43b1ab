"""The pass contract.

A modelpress pass is an ``onnx_ir`` ``InPlacePass`` that rewrites one graph at a time and counts its
rewrites. The base class walks the main graph, every subgraph (If/Loop/Scan bodies) and every local
function, so a pass never breaks a subgraph by forgetting it; a pass that cannot handle subgraphs
sets ``recurse = False`` and leaves them (and functions) untouched, one that has not been made for
functions sets ``functions = False``.

A pass that declines a rewrite it found says why with ``refuse(node, reason)``: one debug-level
line on the pass module's logger (``logging.getLogger("modelpress.passes.fuse_matmul_add")``, ...),
so ``-v`` style logging explains a model that was not optimized as expected. Most passes get this
from ``rule.RewritePass``, which separates the precondition from the rewrite.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from modelpress.ir.stats import iter_graphs, iter_nodes


class GraphPass(InPlacePass):
    """Base of every registered pass. Subclasses implement ``rewrite_graph`` and return a count."""

    #: registry name, e.g. "fuse-conv-bn"
    name: str = ""
    #: the lowest optimization level that runs this pass
    level: int = 2
    #: False for passes whose output ties the model to one runtime (level 3)
    standard: bool = True
    #: whether the pass also rewrites subgraphs and functions
    recurse: bool = True
    #: whether the pass also rewrites local functions (when ``recurse``)
    functions: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.rewrites = 0
        self.model: ir.Model | None = None
        self.log = logging.getLogger(type(self).__module__)

    def call(self, model: ir.Model) -> PassResult:
        self.model = model
        graphs: list[ir.Graph | ir.Function] = (
            list(iter_graphs(model.graph)) if self.recurse else [model.graph]
        )
        if self.recurse and self.functions:
            graphs.extend(model.functions.values())
        count = 0
        for graph in graphs:
            count += self.rewrite_graph(graph)
        self.rewrites += count
        return PassResult(model, modified=count > 0)

    def opset(self, domain: str = "") -> int:
        """The model's opset version for ``domain`` (0 when the model does not import it)."""
        assert self.model is not None
        return self.model.opset_imports.get(domain, 0)

    def refuse(self, node: ir.Node | None, reason: str) -> None:
        """Record that a rewrite anchored at ``node`` was declined, and why (debug log)."""
        if not self.log.isEnabledFor(logging.DEBUG):
            return
        where = "" if node is None else f" {node.op_type} {node.name or '(unnamed)'}"
        self.log.debug(
            "%s:%s refused: %s",
            self.name,
            where,
            reason,
            extra={"pass_name": self.name, "reason": reason},
        )

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


def _size(model: ir.Model) -> int:
    nodes = sum(1 for _ in iter_nodes(model.graph))
    inits = sum(len(g.initializers) for g in iter_graphs(model.graph))
    return nodes + inits


class WrappedPass(GraphPass):
    """An ``onnx_ir`` pass run as a modelpress pass: ``make()`` builds it; it handles subgraphs and
    functions itself. Its rewrites are counted as the nodes and initializers that disappeared."""

    recurse = False
    level = 1

    def make(self) -> ir.passes.PassBase:  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, model: ir.Model) -> PassResult:
        self.model = model
        before = _size(model)
        result = self.make()(model)
        removed = max(before - _size(result.model), 0)
        self.rewrites += removed
        return PassResult(result.model, modified=removed > 0)
