"""Identity elimination: ``Identity(x)`` → ``x``.

Legal always, with one care for graph outputs, which is the precondition (``check``): the output
keeps its name, so ``x`` must be able to take it, and a subgraph whose output would become a value
of an enclosing graph (or its own input) keeps its Identity, since ONNX Runtime rejects a body that
returns an outer value directly and a Scan/Loop body that passes state through must still
produce it.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from modelpress.passes.rule import RewritePass, output_refusal, replace_all


class EliminateIdentity(RewritePass[ir.Node]):
    """Identity(x) → x."""

    name = "identity"
    level = 1
    ops = ("Identity",)

    def matches(self, graph, node: ir.Node) -> Iterator[ir.Node]:
        if node.inputs[0] is not None:
            yield node

    def check(self, graph, node: ir.Node) -> str | None:
        return output_refusal(node.outputs[0], node.inputs[0], graph)

    def rewrite(self, graph, node: ir.Node) -> int:
        replace_all(node.outputs[0], node.inputs[0])
        graph.remove(node, safe=True)
        return 1
