"""Families of standard ONNX ops, by what the spec says they share: one list of each, for the
modules that reason about many ops at once."""

from __future__ import annotations

# The ops whose inputs broadcast multidirectionally (NumPy's rules), elementwise.
BROADCASTING = (
    "Add",
    "And",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Div",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Max",
    "Mean",
    "Min",
    "Mod",
    "Mul",
    "Or",
    "Pow",
    "Sub",
    "Sum",
    "Where",
    "Xor",
)

# The reductions over ``axes`` (an attribute, or an input from opset 18; 13 for ReduceSum), with
# ``keepdims``.
REDUCTIONS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)
