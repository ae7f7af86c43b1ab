"""Graph rewrites: one pass a file, each a declared precondition and rewrite (``rule``), the order
they run in as data (``pipeline.PIPELINE``), looked up by name (``registry``), run to a fixed point
by level (``optimize``)."""

from modelpress.passes.optimize import OptimizeResult, PassStats, optimize
from modelpress.passes.pipeline import PIPELINE
from modelpress.passes.registry import REGISTRY, get

__all__ = ["PIPELINE", "REGISTRY", "OptimizeResult", "PassStats", "get", "optimize"]
