"""Run two models on the same inputs and compare them, with tolerances per dtype.

The names load their module on first use (``verify.batching`` and ``verify.llm`` are read
without ``compare``'s sessions).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

_LAZY = {
    "TOLERANCES": "modelpress.verify.compare",
    "OutputDiff": "modelpress.verify.compare",
    "VerifyResult": "modelpress.verify.compare",
    "compare_arrays": "modelpress.verify.compare",
    "run_model": "modelpress.verify.compare",
    "verify": "modelpress.verify.compare",
    "generate_inputs": "modelpress.verify.inputs",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
