"""Dead code: remove nodes whose outputs nobody uses, initializers nobody reads, and the functions
and opset imports nothing refers to any more (``onnx_ir``'s own passes, run as one).

Legal always: a graph's result depends only on what reaches its outputs, and nodes with side
effects do not exist in the standard domains.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

from modelpress.passes.base import WrappedPass


class RemoveDeadCode(WrappedPass):
    """Remove nodes whose outputs nobody uses, and initializers nobody reads."""

    name = "dead-code"

    def make(self) -> ir.passes.PassBase:
        return ir.passes.Sequential(
            common.RemoveUnusedNodesPass(),
            common.RemoveUnusedFunctionsPass(),
            common.RemoveUnusedOpsetsPass(),
        )
