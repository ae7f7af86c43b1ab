"""The pass contract.

A modelpress pass is an ``onnx_ir`` ``InPlacePass`` that rewrites one graph at a time and counts its
rewrites. The base class walks the main graph, every subgraph (If/Loop/Scan bodies) and every local
function, so a pass never breaks a subgraph by forgetting it; a pass that cannot handle subgraphs
sets ``recurse = False`` and leaves them untouched.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from modelpress.ir.stats import iter_graphs


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

    def __init__(self) -> None:
        super().__init__()
        self.rewrites = 0
        self.model: ir.Model | None = None

    def call(self, model: ir.Model) -> PassResult:
        self.model = model
        graphs: list[ir.Graph | ir.Function] = (
            list(iter_graphs(model.graph)) if self.recurse else [model.graph]
        )
        if self.recurse:
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

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:  # pragma: no cover - abstract
        raise NotImplementedError
