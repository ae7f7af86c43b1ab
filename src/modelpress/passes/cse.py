"""Common subexpressions: two nodes with the same op, attributes and inputs compute the same value,
so the second one's readers read the first one's result (``onnx_ir``'s own pass).

Legal for deterministic ops; onnx_ir's pass skips the random ones (RandomNormal, ...).
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

from modelpress.passes.base import WrappedPass


class CommonSubexpressions(WrappedPass):
    """Two nodes with the same op, attributes and inputs compute the same value: keep one."""

    name = "cse"
    level = 2

    def make(self) -> ir.passes.PassBase:
        return common.CommonSubexpressionEliminationPass()
