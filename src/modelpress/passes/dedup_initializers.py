"""Duplicate initializers: constants with equal dtype, shape and bytes become one (``onnx_ir``'s
own pass, which compares hashes and then the bytes). Legal always.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

from modelpress.passes.base import WrappedPass


class DeduplicateInitializers(WrappedPass):
    """Initializers with equal dtype, shape and bytes become one. Legal always."""

    name = "dedup-initializers"

    def make(self) -> ir.passes.PassBase:
        return common.DeduplicateHashedInitializersPass()
