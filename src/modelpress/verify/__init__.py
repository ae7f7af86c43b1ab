"""Run two models on the same inputs and compare them, with tolerances per dtype.

The names load their module on first use (``verify.batching`` and ``verify.llm`` are read
without ``compare``'s sessions).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "compare": [
            "TOLERANCES",
            "OutputDiff",
            "VerifyResult",
            "compare_arrays",
            "run_model",
            "verify",
        ],
        "inputs": ["generate_inputs"],
    },
)
