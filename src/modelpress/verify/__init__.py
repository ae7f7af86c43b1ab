"""Run two models on the same inputs and compare them, with tolerances per dtype."""

from modelpress.verify.compare import (
    TOLERANCES,
    OutputDiff,
    VerifyResult,
    compare_arrays,
    run_model,
    verify,
)
from modelpress.verify.inputs import check_feeds, generate_inputs, load_npz

__all__ = [
    "TOLERANCES",
    "OutputDiff",
    "VerifyResult",
    "check_feeds",
    "compare_arrays",
    "generate_inputs",
    "load_npz",
    "run_model",
    "verify",
]
