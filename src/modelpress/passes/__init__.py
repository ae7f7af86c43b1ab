"""Graph rewrites: one pass a file, a registry, pipelines by level.

Importing a pass module registers it; the import order below is the order passes run in each round.
"""

# ruff: noqa: F401, I001  (imports register the passes; their order matters)
# --- clean-up ---
from modelpress.passes import cleanup
# --- no-op elimination, constant folding, replacements ---
# --- fusions ---
# --- reordering and cancellation ---
# --- level 3: ONNX Runtime-specific ---
from modelpress.passes.optimize import OptimizeResult, PassStats, optimize
from modelpress.passes.registry import REGISTRY, get, register

__all__ = ["REGISTRY", "OptimizeResult", "PassStats", "get", "optimize", "register"]
