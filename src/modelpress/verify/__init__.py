"""Run two models on the same inputs and compare them, with tolerances per dtype."""

from modelpress.verify.compare import (
    TOLERANCES,
    OutputDiff,
    VerifyResult,
    compare_arrays,
    run_model,
    verify,
)
from modelpress.verify.inputs import generate_inputs

__all__ = [
    "TOLERANCES",
    "OutputDiff",
    "VerifyResult",
    "compare_arrays",
    "generate_inputs",
    "run_model",
    "verify",
]
